"""Llama-family decoder (llama, mistral, qwen2) over a packed batch of tokens.

Tokens of many sequences — prefill chunks and decode tokens alike — are concatenated into one
[num_tokens] batch. Every linear layer runs once over the whole batch; only attention needs to
know where sequences begin and end, and it gets that from `AttentionMetadata` and the block
tables. New K/V go into the pool through `kernels.store_kv`; attention reads the pool through
`kernels.paged_attention`. Numerics follow transformers' LlamaForCausalLM so greedy outputs match.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels import kv_quant
from engine.exec.cpu_linear import layer_linear as _linear
from engine.exec.models.llama_weights import LINEAR_NAMES, prepared_weights

log = logging.getLogger("paged_chat.engine")


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor    # int64 [num_tokens]
    block_tables: torch.Tensor    # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor        # int32 [num_seqs], context incl. this step's tokens
    cu_seqlens_q: torch.Tensor    # int32 [num_seqs + 1]
    max_seqlen_q: int
    backend: str


def rope_tables(config, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for every position, computed exactly as transformers does (incl. scaled RoPE)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        dim = head_dim_of(config)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scaling = 1.0
    elif rope_type == "dynamic":
        raise ValueError("dynamic NTK RoPE scaling is not supported (its tables change with length)")
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(device), (emb.sin() * scaling).to(device)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, d]; cos/sin: [T, d]. The rotate-half convention of HF checkpoints."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


LEAN_STEP_MODES = ("auto", "on", "off")
LEAN_AUTO_MAX_EXTRA_BYTES = 3 * 2**29   # "auto" keeps a second, plain weight copy only up to 1.5 GiB


def make_lean_step(model, plain: list[dict] | None, mode: str, plain_bytes: int = 0):
    """(LeanStep or None, bytes of weights it adds, a phrase for the start-up log). The lean step
    reads plain row-major weights: int8 codes and a dense linear's weight are shared with the
    loop's linears; oneDNN-packed ones are not readable, so it keeps the plain tensors, a second
    copy of every layer weight ("auto" only when that copy is small; "on" always)."""
    from engine.exec.cpu_linear import DenseLinear, Int8Linear
    from kernels import cpu_lean_step
    if mode == "off":
        return None, 0, "loop (lean step off)"
    int8 = model.quantization == "int8"
    if not cpu_lean_step.available(model.dtype, int8):
        return None, 0, f"loop (lean step: {cpu_lean_step.active_path()})"
    if plain is None:          # a shared prepared model that did not keep its plain copy (too big)
        return None, 0, (f"loop (lean step would copy {plain_bytes / 2**30:.1f} GiB of weights; "
                         "--lean-step on to allow)")
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
    tiled = any(d[name].dim() == 4 for d in layers for name in LINEAR_NAMES)
    if mode == "auto" and extra > LEAN_AUTO_MAX_EXTRA_BYTES:
        return None, 0, f"loop (lean step would copy {extra / 2**30:.1f} GiB of weights; --lean-step on to allow)"
    head = model.lm_head_linear
    lm_head, lm_scale = (head.q, head.scale.float()) if isinstance(head, Int8Linear) else (model.lm_head, None)
    try:
        lean = cpu_lean_step.LeanStep(
            layers=layers, embed=model.embed, norm=model.norm, lm_head=lm_head, lm_scale=lm_scale,
            cos=model.cos, sin=model.sin, num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim, intermediate=model.config.intermediate_size, eps=model.eps,
            dtype=model.dtype, tiled=tiled)
    except ValueError as e:
        return None, 0, f"loop ({e})"
    return lean, extra, f"lean C++ step (+{extra / 2**20:.0f} MiB {'tiled' if lean.tiled else 'plain'} weights)"


class LlamaModel:
    """Weights held as plain tensors. q/k/v and gate/up are fused into one GEMM each (fewer ops
    per layer matter at batch 1); each output column is the same dot product as in the unfused
    GEMM, and the tests check logits and greedy tokens against HF."""

    def __init__(self, config, weights: dict, dtype: torch.dtype, device, max_positions: int,
                 quantization: str | None = None, lean_step: str = "auto", weights_key: tuple | None = None):
        """weights_key: the loader's name for these weights (LoadedModel.weights_key), under which
        their prepared form is shared; None prepares them for this model alone."""
        if lean_step not in LEAN_STEP_MODES:
            raise ValueError(f"lean_step must be one of {LEAN_STEP_MODES}, got {lean_step!r}")
        self.config = config
        self.quantization = quantization
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim_of(config)
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.dtype, self.device = dtype, device
        # [d, d] fp32 (kernels/kv_quant.hadamard) when the pool is stored rotated (set by ModelRunner
        # for int8/fp8 KV): q, k, v go in rotated per head, the attention output comes back through it
        self.kv_rotation: torch.Tensor | None = None

        # fused, on the device, CPU linears packed: shared with this process's other engines of the
        # same checkpoint (engine/exec/models/llama_weights.py); the layer dicts are this model's own
        prep = prepared_weights(config, weights, dtype, device, quantization, weights_key,
                                keep_plain_upto=LEAN_AUTO_MAX_EXTRA_BYTES)
        if lean_step == "on" and prep.layers and not prep.plain:      # its plain copy was not kept
            prep = prepared_weights(config, weights, dtype, device, quantization)
        self.embed, self.lm_head, self.norm = prep.embed, prep.lm_head, prep.norm
        self.layers = [dict(L) for L in prep.layers]
        self.lm_head_linear, self.linear_kind = prep.lm_head_linear, prep.linear_kind
        self.lean = None            # kernels/cpu_lean_step.LeanStep: a few tokens' step in one C++ call
        self.lean_extra_bytes = 0   # the plain weight copy it holds beside the packed one
        self.cpu_path = ""          # CPU: which loop, linears and lean step run (start-up log, ModelInfo)
        self.cos, self.sin = rope_tables(config, max_positions, device)
        self.cos, self.sin = self.cos.to(dtype), self.sin.to(dtype)
        if torch.device(device).type == "cpu":
            plain = list(prep.plain) if prep.plain or not prep.layers else None
            self.lean, self.lean_extra_bytes, lean_why = make_lean_step(self, plain, lean_step,
                                                                        prep.plain_extra_bytes)
        # CUDA: the loop with fused Triton layer ops (engine/exec/models/llama_fused.py); CPU: fused
        # C++ layer ops (engine/exec/models/llama_cpu_fused.py) where they build, else the eager loop
        self.use_fused = torch.device(device).type == "cuda"
        self.use_cpu_fused = False
        if torch.device(device).type == "cpu":
            from kernels import cpu_layer_ops
            self.use_cpu_fused = cpu_layer_ops.available(dtype) and self.lm_head_linear is not None
            self.cpu_path = ("fused C++ layer ops" if self.use_cpu_fused else "eager torch ops") + \
                f" ({cpu_layer_ops.active_path()}); linears: {self.linear_kind}; few-token steps: {lean_why}"

    def num_params(self) -> int:
        n = self.embed.numel() + self.norm.numel() + (0 if self.lm_head is self.embed else self.lm_head.numel())
        for layer in self.layers:
            n += sum(t.numel() for t in layer.values() if t is not None)
        return n

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_pool: torch.Tensor,
                meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """Run the packed batch; return fp32 logits for the tokens at `logits_indices`."""
        if (self.lean is not None and meta.backend == "torch"
                and self.lean.takes(input_ids.shape[0], meta.seq_lens.shape[0], kv_quant.is_quantized(kv_pool))
                and self.lean.can_run(kv_pool, self.kv_rotation)):
            # a few tokens (one chat's, a speculative step's, a small batch's decode): weights read once
            from kernels.cpu_lean_step import LeanStepFailed
            try:
                return self.lean(input_ids, positions, meta.slot_mapping, meta.block_tables, meta.seq_lens,
                                 meta.cu_seqlens_q, kv_pool, self.scale, logits_indices, self.kv_rotation)
            except LeanStepFailed as e:        # the loop below serves this step and every later one
                log.warning("lean CPU step off: %s", e)
                self.lean = None
        if self.use_fused:
            from engine.exec.models.llama_fused import forward_fused
            return forward_fused(self, input_ids, positions, kv_pool, meta, logits_indices)
        if self.use_cpu_fused and meta.backend == "torch" and kv_pool.is_contiguous():
            from engine.exec.models.llama_cpu_fused import forward_cpu_fused
            return forward_cpu_fused(self, input_ids, positions, kv_pool, meta, logits_indices)
        T = input_ids.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        inter = self.config.intermediate_size
        cos, sin = self.cos[positions], self.sin[positions]
        R = self.kv_rotation
        x = F.embedding(input_ids, self.embed)
        for i, L in enumerate(self.layers):
            a = rms_norm(x, L["ln1"], self.eps)
            qkv = _linear(L, "qkv", a).view(T, h + 2 * kvh, d)
            qk = apply_rope(qkv[:, :h + kvh], cos, sin)        # q and k heads rotated together
            q, k, v = qk[:, :h], qk[:, h:], qkv[:, h + kvh:]
            if R is not None:           # rotated pool: every kernel sees rotated q, k, v (exact: R @ R = I)
                q, k, v = kv_quant.rotate(q, R, q.dtype), kv_quant.rotate(k, R), kv_quant.rotate(v, R)
            k_cache, v_cache = kv_pool[0, i], kv_pool[1, i]
            kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, backend=meta.backend)
            o = kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                        meta.cu_seqlens_q, self.scale, max_seqlen_q=meta.max_seqlen_q,
                                        backend=meta.backend)
            if R is not None:
                o = kv_quant.rotate(o, R, o.dtype)
            x = x + _linear(L, "o", o.reshape(T, h * d))
            gu = _linear(L, "gate_up", rms_norm(x, L["ln2"], self.eps))
            x = x + _linear(L, "down", F.silu(gu[:, :inter]) * gu[:, inter:])
        x = rms_norm(x[logits_indices], self.norm, self.eps)
        if self.lm_head_linear is not None:
            return self.lm_head_linear(x).float()
        return F.linear(x, self.lm_head).float()
