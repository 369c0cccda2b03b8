"""The routed experts in torch: tokens grouped per expert, one GEMM pair per active expert.

Why grouped per expert: a step's tokens (prefill chunks and decode rows of many sequences) each
pick k of E experts. Looping over tokens would run T x k tiny GEMVs from Python; computing every
expert for every token would do E / k times the work. Sorting the (token, choice) pairs by expert
gives each active expert one contiguous group of rows: one [rows, H] x [H, 2I] GEMM, the
activation, one [rows, I] x [I, H] GEMM, scaled by the router weights and added back to the
tokens' rows. The experts are visited in ascending order and each token's contributions are
added in that order, as transformers' eager experts add them, so fp32 results match its own.

This is the CPU path and the path of every non-CUDA device; on CUDA kernels.moe_experts takes
kernels/triton_moe.py instead (no host sync, one launch per GEMM for all experts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTS = ("silu", "swiglu_clamp")


def act_mul(gu: torch.Tensor, act: str, alpha: float = 0.0, limit: float = 0.0) -> torch.Tensor:
    """gu [rows, 2I] (gate columns, then up) -> [rows, I]. "silu": silu(gate) * up;
    "swiglu_clamp" (gpt-oss): gate clamped above at `limit`, up to [-limit, limit],
    (up + 1) * gate * sigmoid(alpha * gate)."""
    inter = gu.shape[-1] // 2
    gate, up = gu[:, :inter], gu[:, inter:]
    if act == "swiglu_clamp":
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return F.silu(gate) * up


def expert_groups(idx: torch.Tensor, num_experts: int):
    """Sort the (token, choice) pairs by expert: (order, counts) with order [T*k] the flat pair
    indices grouped by expert (ascending; within an expert by token), counts [E]."""
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, torch.bincount(flat, minlength=num_experts)


def moe_experts(
    x, topk_weights, topk_ids, w13, w2, b13=None, b2=None, act="silu", alpha=0.0, limit=0.0
) -> torch.Tensor:
    """sum over the k choices of topk_weights[t, c] * expert_{topk_ids[t, c]}(x[t]), [T, H].
    w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], biases [E, 2I] / [E, H] or None."""
    out = torch.zeros_like(x)
    if not x.shape[0]:
        return out
    order, counts = expert_groups(topk_ids, w13.shape[0])
    k = topk_ids.shape[1]
    tok_of, choice_of = order // k, order % k
    start = 0
    for e, n in enumerate(counts.tolist()):  # one host sync for the whole layer
        if not n:
            continue
        rows, choice = tok_of[start : start + n], choice_of[start : start + n]
        start += n
        h = act_mul(F.linear(x[rows], w13[e], None if b13 is None else b13[e]), act, alpha, limit)
        y = F.linear(h, w2[e], None if b2 is None else b2[e])
        out.index_add_(0, rows, (y * topk_weights[rows, choice, None]).to(out.dtype))
    return out
