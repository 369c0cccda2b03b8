"""A layer's attention, shared by the three forward loops: q/k norm, RoPE, the KV store, paged
attention (full or sliding window), and the KV rotation of quantized pools.

Why one helper: the eager loop (llama.py), the CPU fused loop (llama_cpu_fused.py) and the CUDA
fused loop (llama_fused.py) differ only in *how* they rotate q and k and store k and v (torch ops,
one C++ call, one Triton kernel). Everything around that is the same rule and must stay the same
in all three: which RoPE table and positions a layer uses (none for SmolLM3's NoPE layers), the
per-head q/k RMSNorm before RoPE (Qwen3, Gemma 3), the scratch path for a pool in another format
or a rotated one (kernels/kv_quant.py), the window a layer attends over, and rotating the output
back. Each loop passes its `rope_store`; `LayerAttention` does the rest, including where the layer's
KV lives: its pool layer slot and KV cache group (`model.kv_layer[i]`, engine/kv/cache_spec.py),
whose slots and block tables the step's metadata carries per group.

`rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots) -> q [T, H, d]` rotates the q and
k heads of `qkv` [T, (H + 2 KVH) d], writes rotated k and v at `slots` (-1: skip) of the caches,
and returns rotated q. `converts=True` says it also stores into any pool format (the eager loop's
torch store converts and quantizes itself), so it may write into the pool directly.
"""

from __future__ import annotations

import torch

import kernels
from kernels import kv_quant


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalised in fp32, rounded to x's dtype, times the weight. An
    fp32 weight under a 16-bit x is Gemma's (1 + w) (llama_weights.py): its RMSNorm multiplies in
    fp32 and rounds once (in fp32 both orders are the same product)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32 and x.dtype != torch.float32:
        return (xf * weight).to(x.dtype)
    return weight * xf.to(x.dtype)


def qk_norm(
    qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor, h: int, kvh: int, d: int, eps: float
) -> torch.Tensor:
    """qkv [T, (h + 2 kvh) d] with each q head and each k head RMS-normed over its d dims."""
    T = qkv.shape[0]
    heads = qkv.reshape(T, h + 2 * kvh, d)
    return torch.cat(
        (
            rms_norm(heads[:, :h], q_w, eps),
            rms_norm(heads[:, h : h + kvh], k_w, eps),
            heads[:, h + kvh :],
        ),
        dim=1,
    ).reshape(T, -1)


class LayerAttention:
    """One forward's attention for every layer of model `m` (a LlamaModel): the per-step state
    (positions of NoPE layers, the scratch for foreign pools) is built once, `__call__` per layer."""

    def __init__(
        self,
        m,
        positions: torch.Tensor,
        kv_pool: torch.Tensor,
        meta,
        rope_store,
        converts: bool = False,
    ):
        self.m, self.pool, self.meta, self.rope_store = m, kv_pool, meta, rope_store
        self.positions = positions
        self._zeros = None
        T = positions.shape[0]
        R = m.kv_rotation
        # a pool of another dtype (int8 / bf16 KV under fp32 weights, ...) or a rotated one: RoPE
        # goes into a scratch [T, 1, kvh, d] "cache" at slots 0..T-1 and kernels.store_kv converts
        self.direct = R is None and (converts or kv_pool.dtype == m.dtype)
        if not self.direct:
            self.scratch = torch.empty(
                2, T, 1, m.num_kv_heads, m.head_dim, dtype=m.dtype, device=positions.device
            )
            self.scratch_slots = torch.arange(
                T, dtype=meta.slot_mapping.dtype, device=positions.device
            )

    def _rope(self, name):
        if name is not None:
            cos, sin = self.m.ropes[name]
            return cos, sin, self.positions
        if self._zeros is None:
            self._zeros = torch.zeros_like(self.positions)
        cos, sin = self.m.identity_rope
        return cos, sin, self._zeros

    def __call__(self, i: int, qkv: torch.Tensor) -> torch.Tensor:
        """Layer i's attention of the step's tokens; qkv [T, (H + 2 KVH) d] -> out [T, H, d]."""
        m, meta = self.m, self.meta
        spec = m.spec.layers[i]
        L = m.layers[i]
        if m.spec.qk_norm:
            qkv = qk_norm(
                qkv, L["q_norm"], L["k_norm"], m.num_heads, m.num_kv_heads, m.head_dim, m.eps
            )
        cos, sin, pos = self._rope(spec.rope)
        slot, group = m.kv_layer[i]  # KV cache groups: the layer's pool slot and its group
        k_cache, v_cache = self.pool[0, slot], self.pool[1, slot]
        slots, tables = meta.slots_of(group), meta.tables_of(group)
        R = m.kv_rotation
        if self.direct:
            q = self.rope_store(qkv, cos, sin, pos, k_cache, v_cache, slots)
        else:
            sc = self.scratch
            q = self.rope_store(qkv, cos, sin, pos, sc[0], sc[1], self.scratch_slots)
            k, v = sc[0, :, 0], sc[1, :, 0]
            if R is not None:  # rotated pool (kernels/kv_quant.py): q, k, v per head, exact
                q, k, v = (
                    kv_quant.rotate(q, R, q.dtype),
                    kv_quant.rotate(k, R),
                    kv_quant.rotate(v, R),
                )
            kernels.store_kv(k, v, k_cache, v_cache, slots, backend=meta.backend)
        o = kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            tables,
            meta.seq_lens,
            meta.cu_seqlens_q,
            m.scale,
            max_seqlen_q=meta.max_seqlen_q,
            backend=meta.backend,
            window=spec.window,
            sinks=L.get("sinks"),
        )
        if R is not None:
            o = kv_quant.rotate(o, R, o.dtype)
        return o
