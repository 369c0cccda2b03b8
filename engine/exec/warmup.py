"""Start-up warm-up on CUDA: compile every Triton specialization serving can hit, before serving.

Why: Triton compiles a kernel the first time it sees a new combination of constexprs and argument
specializations (ints equal to 1 or divisible by 16, 16-byte aligned pointers). In eager decode
the split-K count changes with the batch's longest context (merge kernel: one variant per
power-of-two split bound, and per "divisible by 16") and the block-table row stride with the
batch's width, so without a warm-up a chat stalls for a compile the first time a context grows.
The warm-up runs: prefill forwards at block-table widths 1, 3 and 16 (stride specializations), and
one decode attention launch per variant reachable with the engine's widths (decode_plan).
Each stage reports progress. Pool blocks written here hold no cached content and are overwritten
before anything reads them.
"""

from __future__ import annotations

import sys
import time

import torch

import kernels
from engine.exec.models.llama import AttentionMetadata


def _log(msg: str) -> None:
    print(f"[warm-up] {msg}", file=sys.stderr, flush=True)


def _prefill(model, kv_pool, width: int, n_tok: int, backend: str) -> None:
    dev = kv_pool.device
    bs = kv_pool.shape[3]
    n_tok = max(1, min(n_tok, width * bs))
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n_tok, device=dev),
        block_tables=torch.arange(width, dtype=torch.int32, device=dev)[None],
        seq_lens=torch.tensor([n_tok], dtype=torch.int32, device=dev),
        cu_seqlens_q=torch.tensor([0, n_tok], dtype=torch.int32, device=dev),
        max_seqlen_q=n_tok,
        backend=backend,
    )
    model.forward(
        torch.zeros(n_tok, dtype=torch.int64, device=dev),
        torch.arange(n_tok, device=dev),
        kv_pool,
        meta,
        torch.tensor([n_tok - 1], device=dev),
    )


def _decode_splits(model, kv_pool, width: int, splits: int, window: int | None = None) -> None:
    from kernels import triton_attention

    dev = kv_pool.device
    q = torch.zeros(1, model.num_heads, model.head_dim, dtype=model.cos.dtype, device=dev)
    triton_attention.paged_attention(
        q,
        kv_pool[0, 0],
        kv_pool[1, 0],
        torch.zeros(1, width, dtype=torch.int32, device=dev),
        torch.ones(1, dtype=torch.int32, device=dev),
        torch.tensor([0, 1], dtype=torch.int32, device=dev),
        model.scale,
        max_seqlen_q=1,
        num_splits=splits,
        window=window,
    )


def effective_splits(width: int, block_size: int, splits: int, tile: int | None = None) -> int:
    """The split count the decode kernel really launches for a requested one (as triton_attention;
    tile: the selected decode variant's K/V tile by default)."""
    if tile is None:
        from kernels.triton_attention import current_decode_variant

        tile = current_decode_variant().tile_n
    ctx = width * block_size
    per = -(-(-(-ctx // splits)) // tile) * tile
    return max(1, -(-ctx // per))


def decode_variant(width: int, splits: int) -> tuple:
    """What makes Triton compile a new decode/merge variant: split or not, the merge's power-of-two
    bound, its split count's specialization (divisible by 16), and the table row stride's
    specialization (== 1, divisible by 16, other)."""
    p2 = 1 << (splits - 1).bit_length()
    return (splits > 1, p2 if splits > 1 else 1, splits % 16 == 0, width == 1, width % 16 == 0)


def decode_plan(max_width: int, block_size: int) -> list[tuple[int, int]]:
    """One (width, splits) per variant reachable with tables up to max_width blocks."""
    plan: dict[tuple, tuple[int, int]] = {}
    for w in range(1, max_width + 1):
        for req in range(1, 65):
            s = effective_splits(w, block_size, req)
            plan.setdefault(decode_variant(w, s), (w, s))
    return sorted(plan.values())


def warm_up(model, kv_pool: torch.Tensor, backend: str, max_blocks_per_seq: int, log=None) -> dict:
    """Compile what serving needs. Returns {"seconds": ..., "launches": ...}."""
    log = log or _log
    t0 = time.perf_counter()
    bs = kv_pool.shape[3]
    num_blocks = kv_pool.shape[2]
    widths = sorted({w for w in (1, 3, 16, 48) if w <= min(max_blocks_per_seq, num_blocks)})
    for i, w in enumerate(widths):
        _prefill(model, kv_pool, w, w * bs - 1 if w > 1 else 5, backend)
        log(f"prefill variants {i + 1}/{len(widths)} (table width {w})")
    launches = len(widths)
    if backend == "triton":
        plan = decode_plan(min(max_blocks_per_seq, 8192), bs)
        # a window is a runtime int: only one not divisible by 16 is another specialization (issue 45)
        windows = [None] + sorted({w for w in getattr(model.spec, "windows", ()) if w % 16})
        for window in windows:
            for j, (w, splits) in enumerate(plan):
                _decode_splits(model, kv_pool, w, splits, window)
                launches += 1
        log(
            f"decode split-K variants {len(plan)}/{len(plan)} (table widths 1..{max_blocks_per_seq})"
        )
    if num_blocks > 1:  # copy-on-write kernel
        kernels.copy_blocks(kv_pool, torch.tensor([[0, 1]], device=kv_pool.device), backend=backend)
    if kv_pool.device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    log(f"done in {secs:.1f} s ({launches} warm-up launches)")
    return {"seconds": secs, "launches": launches}
