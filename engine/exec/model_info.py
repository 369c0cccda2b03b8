"""What callers may know about the loaded model and engine shape, as one frozen value.

Why: the UI, the bench and the tests used to read `llm.engine.hf_config`, `llm.engine.max_model_len`
and the runner's attributes directly, which ties them to the engine's internals (and makes a
remote engine impossible). They read this instead; `LLM.model_info()` builds it once.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from engine.text.reasoning import reasoning_markers


@dataclass(frozen=True)
class ModelInfo:
    name: str  # file or folder name, e.g. "SmolLM2-135M-Instruct.Q4_1"
    source: str  # where it was loaded from
    architecture: str  # e.g. "LlamaForCausalLM"
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    dtype: str  # weights' dtype (and the KV cache's, unless kv_cache_dtype says otherwise)
    max_model_len: int  # prompt + reply
    block_size: int  # tokens per KV block
    num_blocks: int  # KV pool size
    kv_bytes_per_token: (
        int  # 2 x layers x KV heads x row bytes of the pool (kernels/kv_quant.py); with
    )
    # KV cache groups the pool's P layer slots, not every layer
    max_num_seqs: int
    attention_backend: str  # "torch" or "triton"
    device: str
    kv_cache_dtype: str = (
        ""  # the pool's format: float32 / bfloat16 / float16 / int8 / fp8 ("" = unknown)
    )
    eos_token_ids: tuple = ()  # ids that end a reply (engine/text/end_of_turn.py); () = unknown (remote)
    compute_path: str = (
        ""  # CPU: which loop, linears and lean step run (engine/exec/models/llama.py)
    )
    lean_step_bytes: int = 0  # CPU: the plain weight copy the lean step keeps (0 = none)
    layer_windows: tuple = ()  # per layer: its sliding window in tokens, 0 = full attention (issue 45)
    reasoning_markers: tuple = ()  # ("<think>", "</think>") for a thinking model (engine/text/reasoning.py)
    thinking_switch: bool = (
        False  # its chat template takes enable_thinking (a per-chat "think" switch)
    )
    # what is not KV (issue 51): per layer its mixer ("attention" keeps KV, "linear" a fixed state per
    # chat: engine/kv/state_groups.py), one chat's state over all linear layers, and the weights held
    # and read per decoded token (a mixture of experts reads k of E experts; engine/observe/state_memory.py)
    layer_mixers: tuple = ()
    state_bytes_per_slot: int = 0
    weights_bytes: int = 0
    weights_read_per_token_bytes: int = 0
    experts: tuple = ()  # (experts per MoE layer, experts each token uses), () = dense

    def to_json(self) -> dict:
        return asdict(self)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The one formula: 2 (K and V) x layers x KV heads (not attention heads) x head_dim x bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_dtype_name(dtype) -> str:
    """torch dtype of the pool -> the --kv-cache-dtype spelling (float8_e4m3fn is 'fp8')."""
    name = str(dtype).removeprefix("torch.")
    return "fp8" if name.startswith("float8") else name


def model_name(source: str) -> str:
    base = os.path.basename(str(source or "").rstrip("/"))
    return base[:-5] if base.endswith(".gguf") else base


def build_model_info(
    source: str, hf_config, cfg, runner, eos_token_ids=(), tokenizer=None
) -> ModelInfo:
    heads = int(hf_config.num_attention_heads)
    archs = getattr(hf_config, "architectures", None) or [type(hf_config).__name__]
    return ModelInfo(
        name=model_name(source),
        source=str(source),
        architecture=str(archs[0]),
        num_layers=int(hf_config.num_hidden_layers),
        num_attention_heads=heads,
        num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads),
        hidden_size=int(hf_config.hidden_size),
        vocab_size=int(hf_config.vocab_size),
        dtype=str(cfg.dtype),
        max_model_len=int(runner.max_model_len),
        block_size=int(cfg.block_size),
        num_blocks=int(runner.num_blocks),
        kv_bytes_per_token=int(runner.kv_bytes_per_token),
        max_num_seqs=int(cfg.max_num_seqs),
        attention_backend=str(runner.backend),
        device=str(cfg.device),
        kv_cache_dtype=kv_dtype_name(runner.kv_dtype),
        eos_token_ids=tuple(sorted(eos_token_ids)),
        compute_path=str(runner.model.cpu_path),
        lean_step_bytes=int(runner.model.lean_extra_bytes),
        layer_windows=tuple(int(s.window or 0) for s in runner.model.spec.layers),
        reasoning_markers=reasoning_markers(tokenizer) if tokenizer is not None else (),
        thinking_switch="enable_thinking" in str(getattr(tokenizer, "chat_template", None) or ""),
        **_not_kv(runner, hf_config),
    )


def _not_kv(runner, hf_config) -> dict:
    """ModelInfo's issue-51 fields: layer mixers, the state slot's bytes, weights held / read per token."""
    from engine.exec.models.hybrid_spec import params_per_token

    spec = runner.model.spec
    total, active = params_per_token(spec, hf_config)
    itemsize = runner.model.embed.element_size()
    moe = next((s.moe for s in spec.layers if s.moe is not None), None)
    return dict(
        layer_mixers=tuple(s.mixer for s in spec.layers),
        state_bytes_per_slot=int(runner.state_bytes_per_slot),
        weights_bytes=total * itemsize,
        weights_read_per_token_bytes=active * itemsize,
        experts=(moe.num_experts, moe.top_k) if moe is not None else (),
    )
