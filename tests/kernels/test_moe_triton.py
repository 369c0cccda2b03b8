"""The Triton grouped-GEMM experts (kernels/triton_moe.py, the CUDA path of kernels.moe_experts)
against a dense fp64 oracle: every token through each of its k experts, weighted and summed.

On CPU the kernel runs under TRITON_INTERPRET=1 (set in conftest) on tiny shapes: the interpreter
costs ~1 ms per launch and ~50 us per program. Cases: one token; an expert with no tokens (its
weights are NaN, so a read of them shows); uneven counts with one expert's run longer than a row
block; top-k 1 / 2 / 4; SwiGLU and gpt-oss's clamped SwiGLU with biases; fp32 / bf16 / fp16; and a
case with small explicit tiles so the K loop, several column programs and partial tiles run.
In 16-bit dtypes the kernel rounds where eager torch rounds, so its error against the oracle is
held to that of the torch path (kernels/moe_torch.py) on the same inputs.
At the engine: the MoE layer with the kernel against the torch path, and the whole tiny qwen3_moe /
gpt-oss model on the Triton path (meta.backend "triton", as on CUDA) against HF fp32.
The sm_90 compile of the two kernels (no GPU needed) is part of tests/kernels/test_fused.py's run of
scripts/compile_sm90.py (the whole table: --only moe).
"""

import pytest
import torch

from kernels import moe_torch, triton_moe
from tests.kernels.helpers import DEVICE

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GPT_OSS = dict(alpha=1.702, limit=7.0)


def oracle(x, w, ids, w13, w2, b13, b2, act, alpha=0.0, limit=0.0):
    """fp64, dense per (token, choice): no grouping, no sorting, no padding."""
    x, w, w13, w2 = (t.double() for t in (x, w, w13, w2))
    inter = w2.shape[2]
    gu = torch.einsum("th,tkoh->tko", x, w13[ids])
    if b13 is not None:
        gu = gu + b13.double()[ids]
    gate, up = gu[..., :inter], gu[..., inter:]
    if act == "swiglu_clamp":
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        h = (up + 1) * gate * torch.sigmoid(alpha * gate)
    else:
        h = gate * torch.sigmoid(gate) * up
    y = torch.einsum("tki,tkhi->tkh", h, w2[ids])
    if b2 is not None:
        y = y + b2.double()[ids]
    return (y * w[..., None]).sum(1)


def case(T, H, inter, E, k, ids=None, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    w13 = torch.randn(E, 2 * inter, H, generator=g) / H**0.5 * 2
    w2 = torch.randn(E, H, inter, generator=g) / inter**0.5 * 2
    b13 = torch.randn(E, 2 * inter, generator=g) if bias else None
    b2 = torch.randn(E, H, generator=g) if bias else None
    unused = sorted(set(range(E)) - set(ids.reshape(-1).tolist()))
    for e in unused:  # an expert with no tokens must never be read
        w13[e], w2[e] = float("nan"), float("nan")
        if bias:
            b13[e], b2[e] = float("nan"), float("nan")
    return x, w, ids, w13, w2, b13, b2, unused


def uneven_ids():
    """20 tokens: every one picks expert 2 first (a run of 20 > the 16-row block), second
    choices spread unevenly over 0, 1, 3, 4; expert 5 gets nothing."""
    second = torch.tensor([0] * 9 + [1] * 2 + [3] * 1 + [4] * 8)
    return torch.stack([torch.full((20,), 2), second], 1)


CASES = {  # name: (T, H, inter, E, k, ids, act, bias, tiles)
    "one-token-k1": (1, 32, 24, 4, 1, None, "silu", False, None),
    "uneven-k2": (20, 32, 24, 6, 2, uneven_ids(), "silu", False, None),
    "uneven-k2-gptoss": (20, 32, 24, 6, 2, uneven_ids(), "swiglu_clamp", True, None),
    "k4-gptoss": (5, 32, 24, 8, 4, None, "swiglu_clamp", True, None),
    "k4-small-tiles": (6, 48, 40, 5, 4, None, "silu", True, (16, 16, 16, 4)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_grouped_experts_match_dense_fp64(name, dtype):
    T, H, inter, E, k, ids, act, bias, tiles = CASES[name]
    x, w, ids, w13, w2, b13, b2, unused = case(T, H, inter, E, k, ids, bias, seed=len(name))
    assert name.startswith("k4") or unused, "each case but k=4 keeps an expert with no tokens"
    kw = GPT_OSS if act == "swiglu_clamp" else {}
    ref = oracle(x, w, ids, w13, w2, b13, b2, act, **kw)
    assert ref.isfinite().all() and ref.std() > 0.3
    cast = [None if t is None else t.to(dtype) for t in (x, w, w13, w2, b13, b2)]
    dev = [None if t is None else t.to(DEVICE) for t in cast]
    out = triton_moe.moe_experts(
        dev[0], dev[1], ids.to(DEVICE), dev[2], dev[3], dev[4], dev[5], act=act, tiles=tiles, **kw
    )
    assert out.dtype == dtype and out.shape == (T, H)
    err = (out.double().cpu() - ref).abs().max().item()
    if dtype == torch.float32:
        assert err < 2e-5 * ref.abs().max().item(), err
    else:  # the same roundings as the torch path: no worse than it, up to a few units
        torch_out = moe_torch.moe_experts(cast[0], cast[1], ids, *cast[2:], act=act, **kw)
        torch_err = (torch_out.double() - ref).abs().max().item()
        eps = torch.finfo(dtype).eps * ref.abs().max().item()
        assert err <= 1.5 * torch_err + 2 * eps, (err, torch_err)


def test_alignment_groups_pairs_per_expert_in_blocks():
    """Every (token, choice) pair appears once, each row block holds one expert's pairs, runs
    are padded with the sentinel, blocks past the last run carry expert E (skipped)."""
    ids = uneven_ids()
    E, bm = 6, 16
    pairs, block_expert = triton_moe.align_by_expert(ids, E, bm)
    flat = ids.reshape(-1)
    real = pairs[pairs < flat.numel()]
    assert sorted(real.tolist()) == list(range(flat.numel()))
    for b, e in enumerate(block_expert.tolist()):
        rows = pairs[b * bm : (b + 1) * bm]
        rows = rows[rows < flat.numel()].long()
        if e == E:
            assert rows.numel() == 0
        else:
            assert rows.numel() and (flat[rows] == e).all()
    used = block_expert[block_expert < E].tolist()
    assert used == [0, 1, 2, 2, 3, 4]  # expert 2 (20 rows) takes two blocks; 5 none


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_moe_layer_with_the_kernel_equals_the_torch_path(family):
    """The engine's MoE layer (router, experts; gpt-oss: router bias, expert biases, clamped
    SwiGLU) on a tiny shipped config with backend="triton" gives the torch path's output (on a
    GPU this is the path LlamaModel.forward takes: meta.backend is "triton" there)."""
    from engine.exec.models.llama import LlamaModel
    from engine.exec.models.moe import moe_forward
    from tests.engine.exec import hybrid_helpers as hh

    cfg = hh.config(family)
    m = LlamaModel(cfg, hh.weights(family, cfg), torch.float32, DEVICE, max_positions=64)
    i = next(j for j, s in enumerate(m.spec.layers) if s.moe is not None)
    L, spec = m.layers[i], m.spec.layers[i].moe
    x = torch.randn(13, cfg.hidden_size, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    ref = moe_forward(x, L, spec, backend="torch")
    out = moe_forward(x, L, spec, backend="triton")
    assert ref.std() > 0.05
    assert (out - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_model_on_the_triton_path_equals_hf(family):
    """The whole tiny model as the CUDA engine runs it (meta.backend "triton": the per-layer loop
    with Triton store, paged attention incl. gpt-oss's sinks and window, and these experts): a
    40-token prefill and two decode steps, fp32 logits within 1e-4 of HF, greedy identical."""
    from engine.exec.models.llama import AttentionMetadata, LlamaModel
    from tests.engine.exec import hybrid_helpers as hh

    cfg = hh.config(family)
    m = LlamaModel(cfg, hh.weights(family, cfg), torch.float32, DEVICE, max_positions=64)
    ids, bs = hh.prompt(1, 42), 16
    pool = torch.full(
        (2, m.num_kv_layers, 6, bs, m.num_kv_heads, m.head_dim), float("nan"), device=DEVICE
    )
    table = torch.arange(1, 6, dtype=torch.int32).flip(0)[None]
    out, start = [], 0
    for n in (40, 1, 1):
        end = start + n
        slots = torch.tensor([int(table[0, p // bs]) * bs + p % bs for p in range(start, end)])
        meta = AttentionMetadata(
            slots.to(DEVICE),
            table.to(DEVICE),
            torch.tensor([end], dtype=torch.int32, device=DEVICE),
            torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
            n,
            "triton",
        )
        out.append(
            m.forward(
                torch.tensor(ids[start:end], device=DEVICE),
                torch.arange(start, end, device=DEVICE),
                pool,
                meta,
                torch.arange(n, device=DEVICE),
            ).cpu()
        )
        start = end
    ours, ref = torch.cat(out), hh.hf_logits(family, ids)
    assert ref.std() > 0.3
    assert (ours - ref).abs().max().item() < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
