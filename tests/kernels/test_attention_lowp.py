"""bf16 and fp16 paged attention (Triton and torch) against fp64 dense attention.

On a GPU the Triton kernels run natively in 16 bits (Q, K, V and the probabilities P are 16-bit
inputs to tl.dot, accumulators fp32); on CPU the interpreter upcasts loads to fp32 (it mishandles
bf16 arithmetic, see NOTES.md), so there only the 16-bit loads/stores and the layout are exercised.
The oracle sees the same stored 16-bit values, so the only legitimate error is rounding inside the
kernel (P, the output). Two bounds, both must hold:
- absolute: |err| <= 4 eps(dtype) (+ 4 eps relative), eps = 2^-7 for bf16, 2^-10 for fp16;
- relative to a plain torch attention computed in that dtype (what HF's eager attention does):
  our max error <= 2x its max error + eps/4. A kernel reading a wrong block, dropping a split or
  mis-scaling is off by O(1) and fails both.
"""

import pytest
import torch

from tests.kernels.helpers import build_case, decode_seqs, extend_seqs, oracle, run_backend

LOWP = [torch.bfloat16, torch.float16]


def native_dense(c) -> torch.Tensor:
    """Dense attention in the case's dtype (fp32 softmax, 16-bit matmuls' inputs), like HF eager."""
    pool, dt = c["pool"], c["query"].dtype
    kc, vc = pool[0, 1].cpu(), pool[1, 1].cpu()
    _, bs, kvh, d = kc.shape
    H = c["query"].shape[1]
    cu = [int(x) for x in c["cu_seqlens_q"]]
    out = torch.zeros(c["query"].shape, dtype=dt)
    for i, ctx in enumerate(int(x) for x in c["seq_lens"]):
        q = c["query"][cu[i] : cu[i + 1]].cpu()
        ids = [int(b) for b in c["block_tables"][i, : (ctx + bs - 1) // bs]]
        k = torch.cat([kc[b] for b in ids])[:ctx].repeat_interleave(H // kvh, 1)
        v = torch.cat([vc[b] for b in ids])[:ctx].repeat_interleave(H // kvh, 1)
        s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * c["scale"]
        ql = q.shape[0]
        future = torch.arange(ctx)[None, :] > torch.arange(ctx - ql, ctx)[:, None]
        p = s.masked_fill(future, -torch.inf).softmax(-1).to(dt)
        out[cu[i] : cu[i + 1]] = torch.einsum("hqk,khd->qhd", p.float(), v.float()).to(dt)
    return out


def check_lowp(c, out):
    dt = c["query"].dtype
    eps = torch.finfo(dt).eps
    ref = oracle(c)
    assert not out.isnan().any(), "NaN in output: a wrong block/slot was read or a row skipped"
    err = (out.double().cpu() - ref).abs()
    torch.testing.assert_close(out.double().cpu(), ref, atol=4 * eps, rtol=4 * eps)
    base = (native_dense(c).double() - ref).abs().max().item()
    assert err.max().item() <= 2 * base + eps / 4, (
        f"error {err.max().item():.2e} vs dense {dt}: {base:.2e}"
    )
    return err.max().item()


# (block_size, head_dim, q_heads, kv_heads, num_splits, tile_n)
DECODE = [(16, 64, 8, 2, None, None), (32, 128, 9, 3, 3, None), (16, 128, 16, 1, 1, 64)]
EXTEND = [(16, 64, 8, 2, None), (32, 128, 4, 4, 32)]


def _id(p):
    return "-".join(str(x) for x in p)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("case", DECODE, ids=_id)
def test_decode_lowp(case, dtype, backend):
    bs, d, H, kvh, splits, tile = case
    c = build_case(bs, H, kvh, d, decode_seqs(bs), dtype, seed=11)
    kw = {} if backend == "torch" else dict(num_splits=splits, tile_n=tile)
    check_lowp(c, run_backend(c, backend, **kw))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", LOWP, ids=str)
@pytest.mark.parametrize("case", EXTEND, ids=_id)
def test_extend_lowp(case, dtype, backend):
    bs, d, H, kvh, tile = case
    c = build_case(bs, H, kvh, d, extend_seqs(bs), dtype, seed=12)
    kw = {} if backend == "torch" else dict(tile_n=tile)
    check_lowp(c, run_backend(c, backend, **kw))


def test_lowp_check_catches_a_wrong_block():
    """The bounds are tight enough to see one wrong block: the output computed with sequence 1's
    first block swapped for sequence 0's fails the check against the true tables."""
    c = build_case(16, 64, 8, 2, [(40, 1), (60, 1)], torch.bfloat16, seed=13)
    check_lowp(c, run_backend(c, "torch"))
    right = c["block_tables"].clone()
    c["block_tables"][1, 0] = right[0, 0]
    wrong = run_backend(c, "torch")
    c["block_tables"] = right
    with pytest.raises(AssertionError):
        check_lowp(c, wrong)


def test_split_k_fills_an_h200_at_batch_64():
    """132 SMs, 2 programs per SM: batch 64 x 8 KV heads (512 programs) needs splits for 2 waves."""
    from kernels import triton_attention as ta

    sms, per_wave = 132, 132 * ta.DECODE_BLOCKS_PER_SM
    for batch, kvh, ctx in [
        (64, 8, 4096),
        (1, 8, 4096),
        (8, 2, 2048),
        (256, 8, 4096),
        (64, 3, 1024),
    ]:
        s = ta.choose_num_splits(batch, kvh, ctx, None, 64, num_sms=sms)
        progs = batch * kvh * s
        assert progs >= 2 * per_wave or ctx // s <= 2 * ta.MIN_SPLIT_POSITIONS, (batch, kvh, ctx, s)
        assert ctx // s >= ta.MIN_SPLIT_POSITIONS, "split shorter than worth it"
    assert ta.choose_num_splits(64, 8, 4096, None, 64, num_sms=sms) == 2
    assert ta.choose_num_splits(256, 8, 4096, None, 64, num_sms=sms) == 1
    assert ta.choose_num_splits(1, 8, 128, None, 64, num_sms=sms) == 1  # too short to split
