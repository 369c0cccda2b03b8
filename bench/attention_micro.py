"""Decode attention alone: the compiled in-place CPU kernel against the torch gather path.

    python -m bench.attention_micro [--dtype float32|bfloat16] [--repeats 20]

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64), 16-token blocks with
shuffled block tables, one layer's slab of a pool. Prints the median ms per call for 1/16/64
sequences x 128/512/2048 tokens of context, and the ratio. Both paths run in the same process,
interleaved, so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernels import cpu_attention, reference

H, KVH, D, BS = 9, 3, 64, 16


def make(B: int, ctx: int, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    per = -(-ctx // BS)
    nb = B * per + 1
    k = torch.randn(nb, BS, KVH, D, generator=g).to(dtype)
    v = torch.randn(nb, BS, KVH, D, generator=g).to(dtype)
    tables = (torch.randperm(nb - 1, generator=g)[: B * per] + 1).view(B, per).to(torch.int32)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    lens = torch.full((B,), ctx, dtype=torch.int32)
    return q, k, v, tables, lens


def time_path(use_kernel: bool, args, repeats: int) -> list[float]:
    reference.USE_CPU_KERNEL = use_kernel
    cu = torch.arange(args[0].shape[0] + 1, dtype=torch.int32)
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        reference.paged_attention(*args, cu, D**-0.5, max_seqlen_q=1)
        out.append(time.perf_counter() - t)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    print(
        f"kernel: {cpu_attention.active_path()}; torch threads {torch.get_num_threads()}; {a.dtype}"
    )
    print(f"{'seqs':>5} {'ctx':>6} {'gather ms':>10} {'kernel ms':>10} {'speed-up':>9}")
    with torch.inference_mode():
        for B in (1, 16, 64):
            for ctx in (128, 512, 2048):
                args = make(B, ctx, dtype)
                time_path(True, args, 2), time_path(False, args, 2)  # warm both
                ker, gat = [], []
                for _ in range(a.repeats // 5):  # interleaved rounds
                    ker += time_path(True, args, 5)
                    gat += time_path(False, args, 5)
                mk, mg = statistics.median(ker) * 1e3, statistics.median(gat) * 1e3
                print(f"{B:>5} {ctx:>6} {mg:>10.3f} {mk:>10.3f} {mg / mk:>8.2f}x")
    reference.USE_CPU_KERNEL = True


if __name__ == "__main__":
    main()
