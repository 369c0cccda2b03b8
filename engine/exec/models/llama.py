"""The decoder (llama, mistral, qwen2, qwen3, smollm3, phi3, gemma3 text) over a packed batch.

Tokens of many sequences — prefill chunks and decode tokens alike — are concatenated into one
[num_tokens] batch. Every linear layer runs once over the whole batch; only attention needs to
know where sequences begin and end, and it gets that from `AttentionMetadata` and the block
tables (engine/exec/models/attention_block.py: RoPE, the KV store, paged attention). What differs
between families is data (engine/exec/models/decoder_spec.py): per layer a window and a RoPE
table; per model q/k norms, Gemma's sandwich norms and embedding scale, the MLP activation, the
final soft-cap. Numerics follow transformers' models so greedy outputs match.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels import kv_quant
from engine.exec.cpu_linear import layer_linear as _linear
from engine.exec.models.attention_block import LayerAttention, rms_norm
from engine.exec.models.decoder_spec import describe, describe_layers, head_dim_of
from engine.exec.models import greedy_screens
from engine.exec.models.gated_deltanet import LinearAttention
from engine.exec.models.moe import moe_forward
from engine.exec.models.llama_weights import LINEAR_NAMES, prepared_weights
from engine.exec.models.rope import apply_rope, identity_table, rope_table

__all__ = [
    "AttentionMetadata",
    "LlamaModel",
    "apply_rope",
    "head_dim_of",
    "make_lean_step",
    "rms_norm",
    "rope_tables",
]

log = logging.getLogger("paged_chat.engine")


@dataclass
class AttentionMetadata:
    """Where a step's K/V go and where attention reads them. With KV cache groups
    (engine/kv/cache_spec.py) each group has its own slots and block tables (`group_slots[g]`,
    `group_tables[g]`); `slot_mapping` / `block_tables` are group 0's, and without the group
    fields every layer uses them (a model of one kind, warm-up)."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs], context incl. this step's tokens
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]
    max_seqlen_q: int
    backend: str
    group_slots: torch.Tensor | None = None  # int64 [groups, num_tokens]: row g is group g's
    group_tables: torch.Tensor | None = None  # int32 [groups, num_seqs, max_blocks]
    state_slots: torch.Tensor | None = None  # int64 [num_seqs]: each row's linear-attention state

    def slots_of(self, group: int) -> torch.Tensor:
        return self.group_slots[group] if self.group_slots is not None else self.slot_mapping

    def tables_of(self, group: int) -> torch.Tensor:
        return self.group_tables[group] if self.group_tables is not None else self.block_tables


def rope_tables(config, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the model's first RoPE table for every position (engine/exec/models/rope.py)."""
    spec = describe(config)
    cos, sin = rope_table(config, spec, spec.ropes[0][0], max_positions)
    return cos.to(device), sin.to(device)


LEAN_STEP_MODES = ("auto", "on", "off")
LEAN_AUTO_MAX_EXTRA_BYTES = 3 * 2**29  # "auto" keeps a second, plain weight copy only up to 1.5 GiB


def gemma_16bit(spec, dtype) -> bool:
    """Gemma in bf16/fp16: its norms multiply by (1 + w) in fp32 (weights kept in fp32), which the
    C++ layer ops and lean step (weights in the activation dtype) do not; the eager loop does."""
    return spec.norm_plus_one and dtype != torch.float32


def lean_ext(model) -> tuple[list[dict] | None, str]:
    """The lean step's per-layer extension table for a family beyond plain Llama (kernels/
    cpu_lean_step.py EXT_KEYS), or None for a plain Llama (the C++ runs its old path), and a phrase
    naming what the C++ step computes for this family."""
    spec = model.spec
    plain = (
        not spec.qk_norm
        and not spec.sandwich_norms
        and len(spec.ropes) == 1
        and all(s.rope is not None and not s.window for s in spec.layers)
    )
    if plain:
        return None, ""
    ext = []
    for L, s in zip(model.layers, spec.layers):
        cos, sin = model.ropes[s.rope] if s.rope is not None else model.identity_rope
        ext.append(
            {
                "q_norm": L.get("q_norm"),
                "k_norm": L.get("k_norm"),
                "post_attn": L.get("post_attn"),
                "post_ff": L.get("post_ff"),
                "cos": cos,
                "sin": sin,
                "no_rope": int(s.rope is None),
                "window": s.window or 0,
            }
        )
    return ext, f"{spec.family} layers: {describe_layers(spec)}"


def make_lean_step(model, plain: list[dict] | None, mode: str, plain_bytes: int = 0):
    """(LeanStep or None, bytes of weights it adds, a phrase for the start-up log). The lean step
    reads plain row-major weights: int8 codes and a dense linear's weight are shared with the
    loop's linears; oneDNN-packed ones are not readable, so it keeps the plain tensors, a second
    copy of every layer weight ("auto" only when that copy is small; "on" always)."""
    from engine.exec.cpu_linear import DenseLinear, Int8Linear
    from kernels import cpu_lean_step

    if mode == "off":
        return None, 0, "loop (lean step off)"
    if not model.spec.plain_layers:
        return (
            None,
            0,
            (
                "loop (CPU path: per-layer loop; the lean C++ step does not compute "
                f"{_not_lean(model.spec)})"
            ),
        )
    if gemma_16bit(model.spec, model.dtype):
        return (
            None,
            0,
            "loop (lean step: Gemma's fp32 norm weights under 16-bit activations are not in C++)",
        )
    int8 = model.quantization == "int8"
    if not cpu_lean_step.available(model.dtype, int8):
        return None, 0, f"loop (lean step: {cpu_lean_step.active_path()})"
    if plain is None:  # a shared prepared model that did not keep its plain copy (too big)
        return (
            None,
            0,
            (
                f"loop (lean step would copy {plain_bytes / 2**30:.1f} GiB of weights; "
                "--lean-step on to allow)"
            ),
        )
    layers, extra = [], 0
    for L, P in zip(model.layers, plain):
        d = {"ln1": L["ln1"], "ln2": L["ln2"]}
        for name in LINEAR_NAMES:
            lin = L[name]
            if isinstance(lin, Int8Linear):
                d[name], d[name + "_s"] = lin.q, lin.scale.float()
                if lin.bias is not None:
                    d[name + "_b"] = lin.bias
            else:
                d[name], d[name + "_b"] = P[name], P[name + "_b"]
                if not isinstance(lin, DenseLinear):
                    extra += P[name].numel() * P[name].element_size()
        layers.append(d)
    # packed linears' copies may be in the tiled layout (llama_weights._prepare: all or none;
    # LeanStep refuses a mix)
    tiled = any(d[name].dim() > 2 for d in layers for name in LINEAR_NAMES)
    if mode == "auto" and extra > LEAN_AUTO_MAX_EXTRA_BYTES:
        return (
            None,
            0,
            f"loop (lean step would copy {extra / 2**30:.1f} GiB of weights; --lean-step on to allow)",
        )
    head = model.lm_head_linear
    lm_head, lm_scale = (
        (head.q, head.scale.float()) if isinstance(head, Int8Linear) else (model.lm_head, None)
    )
    ext, family = lean_ext(model)
    screen = None if int8 else greedy_screens.int8_screen(model)
    try:
        lean = cpu_lean_step.LeanStep(
            layers=layers,
            embed=model.embed,
            norm=model.norm,
            lm_head=lm_head,
            lm_scale=lm_scale,
            cos=model.cos,
            sin=model.sin,
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            intermediate=model.config.intermediate_size,
            eps=model.eps,
            dtype=model.dtype,
            tiled=tiled,
            ext=ext,
            embed_scale=model.spec.embed_scale,
            act=model.spec.act,
            screen=screen,
        )
    except ValueError as e:
        return None, 0, f"loop ({e})"
    kind = f"; {family}" if family else ""
    if screen is not None:
        kind += (
            f"; greedy steps screen the LM head with a {screen.nbytes / 2**20:.0f} MiB int8 copy"
        )
    return (
        lean,
        extra,
        f"lean C++ step (+{extra / 2**20:.0f} MiB {'tiled' if lean.tiled else 'plain'} weights{kind})",
    )


def _not_lean(spec) -> str:
    """What a model has that the lean C++ step (and the fused loops) do not compute."""
    parts = []
    if spec.linear_layers:
        parts.append(f"{len(spec.linear_layers)} linear-attention (Gated DeltaNet) layers")
    if spec.has_moe:
        parts.append("routed experts (MoE)")
    if spec.attn_gate:
        parts.append("gated attention outputs")
    if spec.sinks:
        parts.append("attention sinks")
    return ", ".join(parts)


class LlamaModel:
    """Weights held as plain tensors. q/k/v and gate/up are fused into one GEMM each (fewer ops
    per layer matter at batch 1); each output column is the same dot product as in the unfused
    GEMM, and the tests check logits and greedy tokens against HF. `spec` (decoder_spec.py) says
    what each layer is; `ropes` holds one (cos, sin) table per RoPE kind the layers use."""

    def __init__(
        self,
        config,
        weights: dict,
        dtype: torch.dtype,
        device,
        max_positions: int,
        quantization: str | None = None,
        lean_step: str = "auto",
        weights_key: tuple | None = None,
        rope_context: int | None = None,
    ):
        """weights_key: the loader's name for these weights (LoadedModel.weights_key), under which
        their prepared form is shared; None prepares them for this model alone. rope_context: the
        longest context the engine will hold (picks Phi's long or short RoPE factors)."""
        if lean_step not in LEAN_STEP_MODES:
            raise ValueError(f"lean_step must be one of {LEAN_STEP_MODES}, got {lean_step!r}")
        self.config = config
        self.spec = spec = describe(config)
        self.quantization = quantization
        config = self.config = self._text_config(config)
        self.num_layers = config.num_hidden_layers
        self.num_kv_layers = len(spec.kv_layers)  # only attention layers keep KV
        self.linear_index = [
            spec.linear_layers.index(i) if i in spec.linear_layers else None
            for i in range(self.num_layers)
        ]
        self.linear_state = None  # linear_state.LinearState, set by ModelRunner for a hybrid model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = spec.head_dim
        self.eps = config.rms_norm_eps
        self.scale = spec.attn_scale
        self.dtype, self.device = dtype, device
        # [d, d] fp32 (kernels/kv_quant.hadamard) when the pool is stored rotated (set by ModelRunner
        # for int8/fp8 KV): q, k, v go in rotated per head, the attention output comes back through it
        self.kv_rotation: torch.Tensor | None = None
        # (pool layer slot, KV cache group) of each layer (engine/kv/cache_spec.py; ModelRunner sets
        # it with the pool): layer i reads kv_pool[:, slot] through its group's tables and slots
        # (a linear-attention layer keeps no KV: None)
        self.kv_layer: tuple = tuple(
            (spec.kv_layers.index(i), 0) if i in spec.kv_layers else None
            for i in range(self.num_layers)
        )
        self._kv_layer_t = None  # (kv_layer, its int32 [layers, 2] tensor) for the lean step

        # fused, on the device, CPU linears packed: shared with this process's other engines of the
        # same checkpoint (engine/exec/models/llama_weights.py); the layer dicts are this model's own
        prep = prepared_weights(
            config,
            weights,
            dtype,
            device,
            quantization,
            weights_key,
            keep_plain_upto=LEAN_AUTO_MAX_EXTRA_BYTES,
            spec=spec,
        )
        if lean_step == "on" and prep.layers and not prep.plain:  # its plain copy was not kept
            prep = prepared_weights(config, weights, dtype, device, quantization, spec=spec)
        self.embed, self.lm_head, self.norm = prep.embed, prep.lm_head, prep.norm
        self.layers = [dict(L) for L in prep.layers]
        self.lm_head_linear, self.linear_kind = prep.lm_head_linear, prep.linear_kind
        self.lean = None  # kernels/cpu_lean_step.LeanStep: a few tokens' step in one C++ call
        self.greedy_screen = None  # kernels/greedy_head.Bf16Screen: the loop's greedy LM head
        self.lean_extra_bytes = 0  # the plain weight copy it holds beside the packed one
        self.cpu_path = ""  # CPU: which loop, linears and lean step run (start-up log, ModelInfo)
        self.ropes = {}
        for name, _ in spec.ropes:
            cos, sin = rope_table(config, spec, name, max_positions, rope_context)
            self.ropes[name] = (
                cos.to(device=device, dtype=dtype),
                sin.to(device=device, dtype=dtype),
            )
        cos, sin = identity_table(self.head_dim)
        self.identity_rope = (
            cos.to(device=device, dtype=dtype),
            sin.to(device=device, dtype=dtype),
        )
        self.cos, self.sin = self.ropes[spec.ropes[0][0]]  # the first table (lean step, tests)
        # Gemma: embeddings times sqrt(hidden) rounded to the dtype (transformers' scaled embedding)
        self.embed_scale = (
            None
            if spec.embed_scale is None
            else torch.tensor(spec.embed_scale, dtype=torch.float32).to(dtype=dtype, device=device)
        )
        if torch.device(device).type == "cpu":
            plain = list(prep.plain) if prep.plain or not prep.layers else None
            self.lean, self.lean_extra_bytes, lean_why = make_lean_step(
                self, plain, lean_step, prep.plain_extra_bytes
            )
        # CUDA: the loop with fused Triton layer ops (engine/exec/models/llama_fused.py); CPU: fused
        # C++ layer ops (engine/exec/models/llama_cpu_fused.py) where they build, else the eager loop
        self.use_fused = torch.device(device).type == "cuda"
        self.use_cpu_fused = False
        if torch.device(device).type == "cpu":
            from kernels import cpu_layer_ops

            self.use_cpu_fused = (
                cpu_layer_ops.available(dtype)
                and self.lm_head_linear is not None
                and spec.plain_layers
                and not gemma_16bit(spec, dtype)
            )
            loop = (
                "fused C++ layer ops" if self.use_cpu_fused else "eager torch ops"
            ) + f" ({cpu_layer_ops.active_path()})"
            if not spec.plain_layers:
                loop = f"per-layer loop (eager torch ops: {_not_lean(spec)})"
            self.cpu_path = f"{loop}; linears: {self.linear_kind}; few-token steps: {lean_why}"
            self.greedy_screen = greedy_screens.bf16_screen(self)
            if self.greedy_screen is not None:
                self.cpu_path += "; greedy batches screen the LM head with oneDNN's bf16 product"
        # CUDA: routed experts and linear-attention layers run the eager loop with Triton attention
        self.use_fused = self.use_fused and spec.plain_layers

    @staticmethod
    def _text_config(config):
        from engine.exec.models.hybrid_spec import text_config

        return text_config(config)

    def num_params(self) -> int:
        n = (
            self.embed.numel()
            + self.norm.numel()
            + (0 if self.lm_head is self.embed else self.lm_head.numel())
        )
        for layer in self.layers:
            n += sum(t.numel() for t in layer.values() if t is not None)
        return n

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def act_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """act(gate) * up over the fused gate_up GEMM's output [T, 2I] (rounded as transformers)."""
        inter = gu.shape[-1] // 2
        g = gu[:, :inter]
        a = F.silu(g) if self.spec.act == "silu" else F.gelu(g, approximate="tanh")
        return a * gu[:, inter:]

    def kv_layer_tensor(self) -> torch.Tensor:
        """`kv_layer` as int32 [layers, 2] (the lean C++ step's form), built once per mapping."""
        cached = self._kv_layer_t
        if cached is None or cached[0] != self.kv_layer:
            cached = self._kv_layer_t = (
                self.kv_layer,
                torch.tensor(self.kv_layer, dtype=torch.int32),
            )
        return cached[1]

    def logits(self, x: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """The LM head over final-normed rows, fp32 (and Gemma's soft-cap where the config sets one).
        argmax_only (a greedy step): with a screen, exact where a row may be the argmax, -inf
        elsewhere (kernels/greedy_head.py)."""
        if argmax_only and self.greedy_screen is not None and x.shape[0]:
            return self.greedy_screen.logits(x, self.lm_head)
        out = (
            self.lm_head_linear(x) if self.lm_head_linear is not None else F.linear(x, self.lm_head)
        ).float()
        return self.softcap(out)

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma's final soft-cap, in the model's dtype as transformers applies it, returned in fp32."""
        cap = self.spec.final_softcap
        if cap is None:
            return logits
        x = logits.to(self.dtype)
        return (torch.tanh(x / cap) * cap).float()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_pool: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        argmax_only: bool = False,
    ) -> torch.Tensor:
        """Run the packed batch; return fp32 logits for the tokens at `logits_indices`.
        argmax_only: each of those rows wants only its argmax (engine/step_plan.py); the logits
        are then exact where a row may be the argmax and may be -inf elsewhere."""
        groups = meta.group_tables is not None  # KV cache groups: every group's slots and tables
        if (
            self.lean is not None
            and meta.backend == "torch"
            and self.lean.takes(
                input_ids.shape[0], meta.seq_lens.shape[0], kv_quant.is_quantized(kv_pool)
            )
            and self.lean.can_run(kv_pool, self.kv_rotation, groups=groups)
        ):
            # a few tokens (one chat's, a speculative step's, a small batch's decode): weights read once
            from kernels.cpu_lean_step import LeanStepFailed

            try:
                return self.softcap(
                    self.lean(
                        input_ids,
                        positions,
                        meta.group_slots.contiguous() if groups else meta.slot_mapping,
                        meta.group_tables.contiguous() if groups else meta.block_tables,
                        meta.seq_lens,
                        meta.cu_seqlens_q,
                        kv_pool,
                        self.scale,
                        logits_indices,
                        self.kv_rotation,
                        self.kv_layer_tensor() if groups else None,
                        argmax_only=argmax_only,
                    )
                )
            except LeanStepFailed as e:  # the loop below serves this step and every later one
                log.warning("lean CPU step off: %s", e)
                self.lean = None
        if self.use_fused:
            from engine.exec.models.llama_fused import forward_fused

            return forward_fused(self, input_ids, positions, kv_pool, meta, logits_indices)
        if self.use_cpu_fused and meta.backend == "torch" and kv_pool.is_contiguous():
            from engine.exec.models.llama_cpu_fused import forward_cpu_fused

            return forward_cpu_fused(
                self, input_ids, positions, kv_pool, meta, logits_indices, argmax_only
            )
        T = input_ids.shape[0]
        h, d, eps = self.num_heads, self.head_dim, self.eps
        spec = self.spec
        sandwich = spec.sandwich_norms
        attend = LayerAttention(
            self, positions, kv_pool, meta, self._torch_rope_store(meta.backend), converts=True
        )
        linear = LinearAttention(self, meta) if spec.linear_layers else None
        nqkv = (h + 2 * self.num_kv_heads) * d
        x = self.embed_tokens(input_ids)
        for i, L in enumerate(self.layers):
            s = spec.layers[i]
            a = rms_norm(x, L["ln1"], eps)
            if s.mixer == "linear":
                o = linear(i, a)
            else:
                qkv = _linear(L, "qkv", a)
                gate = None
                if spec.attn_gate:  # Qwen3.5: o_proj(attention * sigmoid(gate))
                    qkv, gate = qkv[:, :nqkv].contiguous(), qkv[:, nqkv:]
                o = attend(i, qkv).reshape(T, h * d)
                o = _linear(L, "o", o if gate is None else o * torch.sigmoid(gate))
            x = x + (rms_norm(o, L["post_attn"], eps) if sandwich else o)
            a = rms_norm(x, L["ln2"], eps)
            m = (
                moe_forward(a, L, s.moe, meta.backend)
                if s.moe is not None
                else _linear(L, "down", self.act_mul(_linear(L, "gate_up", a)))
            )
            x = x + (rms_norm(m, L["post_ff"], eps) if sandwich else m)
        return self.logits(rms_norm(x[logits_indices], self.norm, eps), argmax_only)

    def _torch_rope_store(self, backend: str):
        """The eager loop's RoPE + store (attention_block.LayerAttention's `rope_store`): q and k
        heads rotated together in torch, k and v stored by kernels.store_kv (any pool format)."""
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim

        def rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots):
            heads = qkv.view(qkv.shape[0], h + 2 * kvh, d)
            qk = apply_rope(heads[:, : h + kvh], cos[positions], sin[positions])
            kernels.store_kv(
                qk[:, h:], heads[:, h + kvh :], k_cache, v_cache, slots, backend=backend
            )
            return qk[:, :h]

        return rope_store
