"""The mixture-of-experts MLP over a packed batch: route, then the routed experts and the shared
one.

The experts' products are kernels.moe_experts: on CUDA a Triton grouped GEMM over the tokens
sorted per expert (kernels/triton_moe.py, no host sync), elsewhere the torch path that groups
the tokens per expert and runs one GEMM pair per active expert, adding contributions in
ascending expert order as transformers' eager experts do (kernels/moe_torch.py says why).

Weights (prepare_moe) are kept per layer as stacked tensors: w13 [E, 2I, H] (gate rows, then up
rows), w2 [E, H, I] and their biases (gpt-oss); gpt-oss's interleaved, transposed gate_up layout
and its MXFP4 expert blocks are turned into this one layout on load. Experts stay dense under
quantization="int8" (the int8 path quantizes the attention and dense linears only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels

FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """OCP MXFP4: `blocks` uint8 [..., G, 16] hold 32 FP4 (e2m1) codes per group, the low nibble
    first; `scales` uint8 [..., G] one power-of-two exponent per group (biased by 127).
    Returns fp32 [..., G * 32]: code value x 2^(scale - 127)."""
    lut = torch.tensor(FP4_E2M1, dtype=torch.float32, device=blocks.device)
    b = blocks.to(torch.uint8)
    if b.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(b.shape)} do not fit scales {tuple(scales.shape)}")
    vals = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), dim=-1)  # [..., G, 16, 2]
    vals = vals.reshape(*b.shape[:-1], 32)
    vals = torch.ldexp(vals, (scales.to(torch.int32) - 127)[..., None])
    return vals.reshape(*b.shape[:-2], -1)


def _deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """gpt-oss stores gate and up interleaved (gate = [0::2], up = [1::2]): make them halves."""
    n = t.shape[dim]
    idx = torch.cat((torch.arange(0, n, 2), torch.arange(1, n, 2))).to(t.device)
    return t.index_select(dim, idx)


def prepare_moe(weights: dict, prefix: str, spec, w, opt) -> dict:
    """The layer's MoE tensors in the forward's layout. `prefix` is "model.layers.{i}.mlp.";
    w(name) / opt(name) read a checkpoint tensor (in the model's dtype on its device, or None)."""
    E = spec.num_experts
    out: dict = {}
    if spec.router == "topk_softmax":  # gpt-oss
        out["router"], out["router_b"] = w(prefix + "router.weight"), opt(prefix + "router.bias")
        ex = prefix + "experts."
        if ex + "gate_up_proj_blocks" in weights:  # MXFP4 checkpoint: [E, out, in] after dequant
            gu = dequantize_mxfp4(
                weights[ex + "gate_up_proj_blocks"], weights[ex + "gate_up_proj_scales"]
            )
            dn = dequantize_mxfp4(
                weights[ex + "down_proj_blocks"], weights[ex + "down_proj_scales"]
            )
            like = w(ex + "gate_up_proj_bias")
            gu, dn = gu.to(like), dn.to(like)
        else:  # HF's layout: [E, in, out]
            gu, dn = w(ex + "gate_up_proj").transpose(1, 2), w(ex + "down_proj").transpose(1, 2)
        out["w13"] = _deinterleave(gu, 1).contiguous()
        out["w13_b"] = _deinterleave(w(ex + "gate_up_proj_bias"), 1).contiguous()
        out["w2"], out["w2_b"] = dn.contiguous(), w(ex + "down_proj_bias")
    else:  # Qwen3-MoE / Qwen3.5-MoE / Qwen3-Next
        out["router"], out["router_b"] = w(prefix + "gate.weight"), None
        ex = prefix + "experts."
        if ex + "gate_up_proj" in weights:  # transformers' fused in-memory layout
            out["w13"], out["w2"] = w(ex + "gate_up_proj"), w(ex + "down_proj")
        else:  # checkpoint layout: one module per expert
            out["w13"] = torch.stack(
                [
                    torch.cat((w(f"{ex}{e}.gate_proj.weight"), w(f"{ex}{e}.up_proj.weight")))
                    for e in range(E)
                ]
            ).contiguous()
            out["w2"] = torch.stack([w(f"{ex}{e}.down_proj.weight") for e in range(E)]).contiguous()
        out["w13_b"] = out["w2_b"] = None
        if spec.shared:
            sh = prefix + "shared_expert."
            out["sh_gate_up"] = torch.cat(
                (w(sh + "gate_proj.weight"), w(sh + "up_proj.weight"))
            ).contiguous()
            out["sh_down"] = w(sh + "down_proj.weight")
            out["sh_gate"] = w(prefix + "shared_expert_gate.weight")
    want = (E, 2 * spec.intermediate)
    if tuple(out["w13"].shape[:2]) != want:
        raise ValueError(
            f"{prefix}experts: gate/up weights {tuple(out['w13'].shape)} do not fit {E} experts "
            f"of {spec.intermediate}"
        )
    return out


def route(x: torch.Tensor, L: dict, spec) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in x's dtype, expert ids [T, k]) as transformers' routers compute them."""
    logits = F.linear(x, L["router"], L["router_b"])
    if spec.router == "topk_softmax":
        top, idx = torch.topk(logits, spec.top_k, dim=-1)
        return F.softmax(top, dim=1, dtype=top.dtype), idx
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    top, idx = torch.topk(probs, spec.top_k, dim=-1)
    if spec.renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), idx


def moe_forward(x: torch.Tensor, L: dict, spec, backend=None) -> torch.Tensor:
    """The routed MLP (and the shared expert, if any) of x [T, H]. backend as in kernels:
    None picks Triton on CUDA, torch elsewhere."""
    if x.shape[0]:
        weights, idx = route(x, L, spec)
        out = kernels.moe_experts(
            x,
            weights,
            idx,
            L["w13"],
            L["w2"],
            L["w13_b"],
            L["w2_b"],
            act=spec.act,
            alpha=spec.alpha,
            limit=spec.limit,
            backend=backend,
        )
    else:
        out = torch.zeros_like(x)
    if spec.shared:
        gu = F.linear(x, L["sh_gate_up"])
        inter = gu.shape[-1] // 2
        shared = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], L["sh_down"])
        out = out + torch.sigmoid(F.linear(x, L["sh_gate"])) * shared
    return out
