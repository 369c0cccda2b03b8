"""Gated DeltaNet, the linear-attention layer of Qwen3.5 (three of every four layers), over a packed
batch whose sequences each own a state slot.

A layer keeps, per sequence, a recurrent state S [v_heads, k_dim, v_dim] and the last K - 1 inputs
of its causal depthwise convolution (engine/exec/models/linear_state.py holds them, one slot per
sequence). Per token t of a head (S starts at 0 for a sequence's first token):

    x_t = silu(conv(last K inputs of [q|k|v] channels));  q_t, k_t L2-normalised, q_t / sqrt(k_dim)
    S   = exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S = S + k_t d_t^T;   o_t = S^T q_t

with beta_t = sigmoid(b_t), g_t = -exp(A_log) softplus(a_t + dt_bias) <= 0, then a gated RMSNorm
(o normed per head, times silu(z_t)) and the output projection. Decode rows (one token each) take
that step for the whole batch at once. Prefill chunks use the chunked form (below), C = 64 tokens
at a time: the same sums regrouped into matrix products, exact up to floating-point order.

Chunked form, for a chunk with state S_0 at its start and gamma_i = g_1 + ... + g_i (in-chunk
cumulative log decay), unrolling the recurrence gives d = U - W S_0 with
    (I + A) U = diag(beta) V,   (I + A) W = diag(beta exp(gamma)) K,
    A_ij = beta_i exp(gamma_i - gamma_j) k_i.k_j  (j < i, strictly lower triangular),
and then  O = diag(exp(gamma)) Q S_0 + (M o decay) d  with M_ij = q_i.k_j exp(gamma_i - gamma_j) for
j <= i, and the state after the chunk  S_C = exp(gamma_C) S_0 + (diag(exp(gamma_C - gamma)) K)^T d.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.exec.cpu_linear import layer_linear as _linear

CHUNK = 64


def prepare_linear_layer(prefix: str, spec, w) -> dict:
    """Layer tensors: one fused input GEMM (q|k|v conv channels, z, b, a), the conv taps [C, K],
    -exp(A_log) in fp32, dt_bias, the gated norm's weight (plain, not 1 + w) and out_proj."""
    p = prefix + "linear_attn."
    lin_in = torch.cat(
        (
            w(p + "in_proj_qkv.weight"),
            w(p + "in_proj_z.weight"),
            w(p + "in_proj_b.weight"),
            w(p + "in_proj_a.weight"),
        )
    ).contiguous()
    conv = w(p + "conv1d.weight")
    if conv.shape[0] != spec.conv_dim or conv.shape[-1] != spec.conv_kernel:
        raise ValueError(
            f"{p}conv1d.weight {tuple(conv.shape)} does not fit {spec.conv_dim} channels of "
            f"{spec.conv_kernel} taps"
        )
    return {
        "lin_in": lin_in,
        "conv_w": conv.reshape(spec.conv_dim, spec.conv_kernel).contiguous(),
        "neg_A": -w(p + "A_log").float().exp(),
        "dt_bias": w(p + "dt_bias"),
        "gnorm": w(p + "norm.weight"),
        "lin_out": w(p + "out_proj.weight"),
    }


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunked_delta_rule(q, k, v, g, beta, S, chunk: int = CHUNK):
    """q, k [n, H, dk] (normalised; q scaled), v [n, H, dv], g, beta [n, H], S [H, dk, dv]; all
    fp32. Returns (o [n, H, dv], the state after the n tokens). See the module docstring."""
    n, H, dv = v.shape
    o = torch.empty(n, H, dv, dtype=torch.float32, device=v.device)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        Q, K, V = (t[c0:c1].transpose(0, 1) for t in (q, k, v))  # [H, C, d]
        gam = g[c0:c1].transpose(0, 1).cumsum(-1)  # [H, C]
        b = beta[c0:c1].transpose(0, 1)
        C = c1 - c0
        lower = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
        decay = (gam[:, :, None] - gam[:, None, :]).masked_fill(~lower, float("-inf")).exp()
        A = (b[:, :, None] * (K @ K.transpose(1, 2)) * decay).tril(-1)
        eg = gam.exp()
        U = torch.linalg.solve_triangular(A, b[..., None] * V, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(
            A, (b * eg)[..., None] * K, upper=False, unitriangular=True
        )
        d = U - W @ S
        o[c0:c1] = (eg[..., None] * (Q @ S) + ((Q @ K.transpose(1, 2)) * decay) @ d).transpose(0, 1)
        last = gam[:, -1:]
        S = last.exp()[..., None] * S + ((last - gam).exp()[..., None] * K).transpose(1, 2) @ d
    return o, S


def recurrent_step(q, k, v, g, beta, S):
    """One token per row: q, k [B, H, dk], v [B, H, dv], g, beta [B, H], S [B, H, dk, dv] (fp32).
    Returns (o [B, H, dv], S after the token)."""
    S = S * g.exp()[..., None, None]
    mem = (S * k[..., None]).sum(dim=-2)
    d = (v - mem) * beta[..., None]
    S = S + k[..., None] * d[..., None, :]
    return (S * q[..., None]).sum(dim=-2), S


class LinearAttention:
    """One forward's linear-attention layers for model `m`: the rows' token ranges, positions and
    state slots are read once from the step's metadata, `__call__` runs layer i."""

    def __init__(self, m, meta):
        if meta.state_slots is None:
            raise ValueError(
                "a model with linear-attention layers needs state slots in the step's metadata"
            )
        self.m, self.spec = m, m.spec.linear
        self.state = m.linear_state
        cu = meta.cu_seqlens_q.tolist()
        lens = meta.seq_lens.tolist()
        slots = meta.state_slots.tolist()
        self.rows = [
            (cu[r], cu[r + 1], lens[r] - (cu[r + 1] - cu[r]), slots[r]) for r in range(len(lens))
        ]
        self.decode = [
            r for r, (a, b, start, _) in enumerate(self.rows) if b - a == 1 and start > 0
        ]
        dev = meta.cu_seqlens_q.device
        self.dec_tok = torch.tensor(
            [self.rows[r][0] for r in self.decode], dtype=torch.long, device=dev
        )
        self.dec_slot = torch.tensor(
            [self.rows[r][3] for r in self.decode], dtype=torch.long, device=dev
        )
        dec = set(self.decode)
        self.other = [row for r, row in enumerate(self.rows) if r not in dec and row[1] > row[0]]

    def __call__(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i on the normed hidden states x [T, hidden] -> the layer's output [T, hidden]."""
        m, sp = self.m, self.spec
        L = m.layers[i]
        j = m.linear_index[i]
        T = x.shape[0]
        nk, nv, dk, dv, C = sp.num_k_heads, sp.num_v_heads, sp.k_dim, sp.v_dim, sp.conv_dim
        proj = _linear(L, "lin_in", x)
        mixed, z = proj[:, :C], proj[:, C : C + nv * dv]
        b, a = proj[:, C + nv * dv : C + nv * dv + nv], proj[:, C + nv * dv + nv :]
        conv = self._conv(j, mixed, L["conv_w"])  # [T, C], after silu
        beta = b.sigmoid().float()
        g = L["neg_A"] * F.softplus(a.float() + L["dt_bias"])
        rep = nv // nk
        q = (
            l2norm(conv[:, : nk * dk].float().view(T, nk, dk)).repeat_interleave(rep, dim=1)
            * dk**-0.5
        )
        k = l2norm(conv[:, nk * dk : 2 * nk * dk].float().view(T, nk, dk)).repeat_interleave(
            rep, dim=1
        )
        v = conv[:, 2 * nk * dk :].float().view(T, nv, dv)
        core = torch.empty(T, nv, dv, dtype=torch.float32, device=x.device)
        rec = self.state.rec[j]
        if self.decode:
            t, s = self.dec_tok, self.dec_slot
            o, S = recurrent_step(q[t], k[t], v[t], g[t], beta[t], rec.index_select(0, s))
            core[t] = o
            rec.index_copy_(0, s, S)
        for t0, t1, start, slot in self.other:
            S0 = rec[slot] if start > 0 else torch.zeros_like(rec[slot])
            o, S = chunked_delta_rule(q[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], beta[t0:t1], S0)
            core[t0:t1] = o
            rec[slot] = S
        core = core.to(x.dtype).float()  # rounded to the model's dtype first, as HF's is
        normed = L["gnorm"] * (core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + m.eps)).to(
            x.dtype
        )
        out = (normed * F.silu(z.reshape(T, nv, dv).float())).to(x.dtype)
        return _linear(L, "lin_out", out.reshape(T, nv * dv))

    def _conv(self, j: int, mixed: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The causal depthwise conv + silu of every row, each continuing from its slot's tail
        (zeros at a sequence's start); the tails are updated to the rows' last K - 1 inputs."""
        tails = self.state.conv[j]  # [slots, C, K - 1]
        out = torch.empty_like(mixed)
        if self.decode:
            t, s = self.dec_tok, self.dec_slot
            win = torch.cat((tails.index_select(0, s), mixed[t].to(tails.dtype)[:, :, None]), dim=2)
            out[t] = F.silu((win * w).sum(-1)).to(out.dtype)
            tails.index_copy_(0, s, win[:, :, 1:])
        for t0, t1, start, slot in self.other:
            tail = tails[slot] if start > 0 else torch.zeros_like(tails[slot])
            seq = torch.cat((tail, mixed[t0:t1].to(tails.dtype).t()), dim=1)  # [C, K - 1 + n]
            y = F.conv1d(seq[None], w[:, None, :], groups=w.shape[0])[0]  # [C, n]
            out[t0:t1] = F.silu(y).t().to(out.dtype)
            tails[slot] = seq[:, seq.shape[1] - tails.shape[2] :]
        return out
