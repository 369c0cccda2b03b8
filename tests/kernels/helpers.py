"""Helpers the paged-attention tests share: the case builder (NaN pool, permuted block ids), the fp64
dense oracle, and running a backend on a case. Here so that no test module imports another."""

import torch
from kernels import reference


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


TOL = {torch.float32: 1e-4, torch.float16: 3e-3}


def dense_attention_fp64(
    query, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, window=None, sinks=None
):
    """The oracle, deliberately naive and independent of the code under test: per sequence,
    concatenate its blocks in Python, repeat K/V for every query head, fp64 softmax(QK^T)V with
    an explicit causal mask at positions ctx-q_len..ctx-1 (and, with a sliding window W, keys at
    most W-1 positions back). Returns fp64 [num_tokens, H, d]."""
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()
    _, bs, kvh, d = k_cache.shape
    H = query.shape[1]
    out = torch.zeros(query.shape, dtype=torch.float64)
    cu = [int(x) for x in cu_seqlens_q]
    for i, ctx in enumerate(int(x) for x in seq_lens):
        q = query[cu[i] : cu[i + 1]].double().cpu()
        q_len = q.shape[0]
        ids = [int(b) for b in block_tables[i, : (ctx + bs - 1) // bs]]
        k = torch.cat([k_cache[b] for b in ids])[:ctx].double().repeat_interleave(H // kvh, 1)
        v = torch.cat([v_cache[b] for b in ids])[:ctx].double().repeat_interleave(H // kvh, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        kpos, qpos = torch.arange(ctx)[None, :], torch.arange(ctx - q_len, ctx)[:, None]
        hidden = (kpos > qpos) | ((kpos <= qpos - window) if window else False)
        if window:  # released blocks (NaN, see release_outside_window) weigh exactly 0 here
            k, v = k.nan_to_num(), v.nan_to_num()
            s = torch.einsum("qhd,khd->hqk", q, k) * scale
        s = s.masked_fill(hidden, -torch.inf)
        if sinks is not None:  # gpt-oss: one more logit per head in the denominator, no value
            sk = sinks.double().cpu()[:, None, None].expand(H, q_len, 1)
            p = torch.cat((s, sk), -1).softmax(-1)[..., :-1]
        else:
            p = s.softmax(-1)
        out[cu[i] : cu[i + 1]] = torch.einsum("hqk,khd->qhd", p, v)
    return out


def build_case(bs, H, kvh, d, seqs, dtype, share_blocks=0, seed=0, device=DEVICE):
    """seqs: [(prefix_len, q_len)]. Sequence 1 reuses sequence 0's first share_blocks blocks.
    Tensors go to `device` (the GPU when there is one; "cpu" for the CPU kernels' own tests)."""
    g = torch.Generator().manual_seed(seed)
    ctxs = [p + q for p, q in seqs]
    need = [-(-c // bs) for c in ctxs]
    nb = 1 + sum(need) + 4  # block 0 and 4 more stay NaN
    pool = torch.full((2, 2, nb, bs, kvh, d), float("nan"), dtype=dtype)
    free = (torch.randperm(nb - 1, generator=g) + 1).tolist()
    tables = []
    for i, n in enumerate(need):
        shared = tables[0][:share_blocks] if i == 1 else []
        tables.append(shared + [free.pop() for _ in range(n - len(shared))])
    bt = torch.zeros(len(seqs), max(need) + 2, dtype=torch.int32)
    kc, vc = pool[0, 1], pool[1, 1]  # layer 1: layer 0 is NaN memory on either side
    for i, (ctx, blocks) in enumerate(zip(ctxs, tables)):
        bt[i, : len(blocks)] = torch.tensor(blocks)
        first = share_blocks * bs if i == 1 else 0  # shared positions written by sequence 0
        pos = torch.arange(first, ctx)
        blk = torch.tensor(blocks)[pos // bs]
        kc[blk, pos % bs] = torch.randn(len(pos), kvh, d, generator=g).to(dtype)
        vc[blk, pos % bs] = torch.randn(len(pos), kvh, d, generator=g).to(dtype)
    qls = [q for _, q in seqs]
    cu = torch.tensor([0] + torch.tensor(qls).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(sum(qls), H, d, generator=g).to(dtype)
    dev = lambda t: t.to(device)
    return dict(
        query=dev(query),
        pool=dev(pool),
        block_tables=dev(bt),
        seq_lens=dev(torch.tensor(ctxs, dtype=torch.int32)),
        cu_seqlens_q=dev(cu),
        scale=d**-0.5,
        max_seqlen_q=max(qls),
    )


def release_outside_window(c, window):
    """Fill with NaN every block that lies wholly before the window of every query of its sequence
    (what the KV manager may free and hand to someone else): a kernel that reads one fails."""
    bs = c["pool"].shape[3]
    cu = c["cu_seqlens_q"].tolist()
    kc, vc = c["pool"][0, 1], c["pool"][1, 1]
    released = 0
    for i, ctx in enumerate(c["seq_lens"].tolist()):
        first_q = ctx - (cu[i + 1] - cu[i])
        for j in range(max(0, first_q - window + 1) // bs):
            b = int(c["block_tables"][i, j])
            kc[b], vc[b] = float("nan"), float("nan")
            released += 1
    return released


def kernel_args(c) -> tuple:
    """A case's positional arguments of kernels.paged_attention (layer 1 of its pool)."""
    pool = c["pool"]
    return (
        c["query"],
        pool[0, 1],
        pool[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        c["max_seqlen_q"],
    )


def run_backend(c, backend, window=None, **kw):
    args = kernel_args(c)
    out = torch.full_like(c["query"], float("nan"))
    if backend == "torch":
        reference.paged_attention(*args, out=out, window=window)
    else:
        from kernels import triton_attention

        triton_attention.paged_attention(*args, out=out, window=window, **kw)
    return out


def oracle(c, window=None):
    pool = c["pool"]
    return dense_attention_fp64(
        c["query"],
        pool[0, 1],
        pool[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        window,
    )


def check(c, out, ref=None):
    ref = oracle(c) if ref is None else ref
    tol = TOL[c["query"].dtype]
    assert not out.isnan().any(), "NaN in output: a wrong block/slot was read or a row skipped"
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=tol)


def decode_seqs(bs):  # contexts 1, bs-1, bs, bs+1, 300
    return [(c - 1, 1) for c in (1, bs - 1, bs, bs + 1, 300)]


def extend_seqs(bs):
    """(prefix, q_len): contexts 1, bs-1, bs, bs+1, 300; prefix 0 / block-aligned / unaligned;
    chunks 1, 5, 50; the q_len == 1 entries make it a mixed decode + prefill batch."""
    return [(0, 1), (bs - 6, 5), (bs - 1, 1), (bs, 1), (0, 50), (bs, 5), (bs + 3, 50), (250, 50)]
