"""RoPE tables as the kernels use them: cos/sin [positions, head_dim], rotate-half pairs (j, j + d/2).

Why one layout for every family: the RoPE kernels (torch, the C++ layer ops and lean step, Triton)
all rotate pair (j, j + d/2) of a head by table column j. Two variants fit it without a kernel
change:
- partial rotary (Phi-4-mini rotates the first 96 of 128 dims, pairs (j, j + 48)): the model's q
  and k rows are permuted once at load (`partial_rotary_perm`) so those pairs land on (j, j + 64),
  and the pass-through dims get cos 1, sin 0. q.k is a sum over dims, so the same permutation of
  q and k leaves attention unchanged (v and the output are not permuted);
- a layer without RoPE (SmolLM3): `identity_table` (one row: cos 1, sin 0) read at position 0;
  x * 1 + rotated * 0 is x exactly.
Values are computed as transformers computes them (its init functions for llama3, YaRN, longrope,
linear; cos/sin of position x inv_freq in fp32, times the attention scaling), so fp32 logits match.
"""

from __future__ import annotations

import torch


def _inv_freq(
    config, spec, name: str, params: dict, rope_context: int
) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = params.get("rope_type", "default")
    if kind == "default":
        dim = spec.rotary_dim
        base = params.get("rope_theta", 10000.0)
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        factors = getattr(config, "rope_freq_factors", None)  # a Llama 3 GGUF's (gguf_families.py)
        if factors is not None:
            if len(factors) != inv.numel():
                raise ValueError(f"rope_freq_factors: {len(factors)} for {inv.numel()} frequencies")
            inv = inv / torch.tensor(factors, dtype=torch.float32)
        return inv, 1.0
    if kind not in ROPE_INIT_FUNCTIONS:
        from engine.exec.models.decoder_spec import UnsupportedModel

        raise UnsupportedModel(f"RoPE scaling {kind!r} is not supported")
    kw = {"layer_type": name} if spec.family == "gemma3_text" else {}
    if kind == "longrope":
        # transformers switches to the long factors once a forward's positions pass the original
        # context; a paged cache cannot re-rotate cached keys, so the engine picks one set for its
        # whole context: long when it may hold more than the original context, else short (what
        # HF computes for every sequence that fits the original context)
        orig = int(
            params.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", 0)
            or 0
        )
        if orig and rope_context > orig:
            kw["seq_len"] = orig + 1
    inv, scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu", **kw)
    return inv.float(), float(scaling)


def rope_table(config, spec, name: str, max_positions: int, rope_context: int | None = None):
    """(cos, sin) fp32 [max_positions, head_dim] of RoPE table `name` (spec.ropes)."""
    params = dict(spec.ropes)[name]
    inv, scaling = _inv_freq(config, spec, name, params, rope_context or max_positions)
    half = spec.head_dim // 2
    if inv.numel() != spec.rotary_dim // 2:
        raise ValueError(
            f"RoPE {name}: {inv.numel()} frequencies for {spec.rotary_dim} rotary dims"
        )
    freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv[None, :]
    cos, sin = freqs.cos() * scaling, freqs.sin() * scaling
    if inv.numel() < half:  # partial rotary: the permuted pass-through dims are not rotated
        pad = half - inv.numel()
        cos = torch.cat((cos, torch.ones(max_positions, pad)), dim=1)
        sin = torch.cat((sin, torch.zeros(max_positions, pad)), dim=1)
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def identity_table(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row, cos 1 and sin 0: RoPE at position 0 of it leaves q and k exactly as they are."""
    return torch.ones(1, head_dim), torch.zeros(1, head_dim)


def partial_rotary_perm(head_dim: int, rotary_dim: int) -> torch.Tensor | None:
    """new dim -> old dim within a head, so HF's partial pairs (j, j + r/2), j < r/2, become the
    kernels' (j, j + d/2), and the pass-through dims r.. pair among themselves (identity columns).
    None when every dim rotates."""
    d, r = head_dim, rotary_dim
    if r >= d:
        return None
    p = (d - r) // 2
    first = list(range(r // 2)) + list(range(r, r + p))
    second = list(range(r // 2, r)) + list(range(r + p, d))
    return torch.tensor(first + second, dtype=torch.int64)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, d]; cos/sin: [T, d]. The rotate-half convention of HF checkpoints."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
