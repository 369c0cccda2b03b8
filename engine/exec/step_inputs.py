"""One step's integer inputs packed into one staging buffer and moved to the device in ONE copy.

Why: a step needs token ids, positions, slots, block tables, context lengths, query offsets, the
rows to sample and the copy-on-write pairs. As separate `torch.tensor(..., device="cuda")` calls
that is 7-8 synchronous pageable copies per step. Here every field is a fixed, 16-byte aligned
region of one pinned host buffer (filled through numpy, no per-element torch calls), and the used
prefix goes to a same-shaped device buffer with a single non-blocking copy. A CUDA event guards
reuse: the host buffer is not rewritten until the previous step's copy has finished.
On CPU there is no copy: the "device" views are the host buffer itself.

Two layouts share this code: the eager layout (fields sized by the step) and the decode-graph
layout (fields at fixed offsets sized for the largest bucket; CUDA graphs read fixed addresses).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.step_plan import StepPlan

_NP = {torch.int64: np.int64, torch.int32: np.int32}
_SIZE = {torch.int64: 8, torch.int32: 4, torch.uint8: 1}  # itemsize without a torch.empty per field


class StagingBuffer:
    """Host (pinned on CUDA) + device byte buffers of one capacity; grows when a step needs more."""

    def __init__(self, device: torch.device, nbytes: int = 1 << 16):
        self.device = device
        self.on_cuda = device.type == "cuda"
        self._event = torch.cuda.Event() if self.on_cuda else None
        self._pending = False
        self._alloc(nbytes)

    def _alloc(self, nbytes: int) -> None:
        self.capacity = nbytes
        self.host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=self.on_cuda)
        self.host_np = self.host.numpy()
        self.dev = (
            torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
            if self.on_cuda
            else self.host
        )

    def reserve(self, nbytes: int) -> None:
        """Wait until the last copy out of the host buffer is done; grow if too small."""
        if self._pending:
            self._event.synchronize()
            self._pending = False
        if nbytes > self.capacity:
            self._alloc(max(nbytes, 2 * self.capacity))

    def host_view(self, offset: int, n: int, dtype) -> np.ndarray:
        return self.host_np[offset : offset + n * np.dtype(_NP[dtype]).itemsize].view(_NP[dtype])

    def dev_view(self, offset: int, n: int, dtype) -> torch.Tensor:
        return self.dev[offset : offset + n * _SIZE[dtype]].view(dtype)

    def upload(self, nbytes: int) -> None:
        """The one host -> device copy of this step (the first nbytes)."""
        if self.on_cuda and nbytes:
            self.dev[:nbytes].copy_(self.host[:nbytes], non_blocking=True)
            self._event.record()
            self._pending = True


def _align(n: int) -> int:
    return (n + 15) & ~15  # 16 bytes: Triton specializes pointer args on 16-byte alignment


class Layout:
    """Field name -> (offset, count, dtype) in a staging buffer, in the order given."""

    def __init__(self, fields: list[tuple[str, int, torch.dtype]]):
        self.fields, off = {}, 0
        for name, count, dtype in fields:
            self.fields[name] = (off, count, dtype)
            off = _align(off + count * _SIZE[dtype])
        self.nbytes = off

    def host(self, buf: StagingBuffer, name: str) -> np.ndarray:
        off, count, dtype = self.fields[name]
        return buf.host_view(off, count, dtype)

    def dev(self, buf: StagingBuffer, name: str) -> torch.Tensor:
        off, count, dtype = self.fields[name]
        return buf.dev_view(off, count, dtype)


def pack_step(buf: StagingBuffer, plan: StepPlan):
    """Fill and upload one eager step from its plan (engine/step_plan.py), every KV cache group.
    Returns device tensors (ids, positions, slots [G, T], block_tables [G, S, W], seq_lens,
    cu_seqlens_q, logits_idx, copies or None) and max_seqlen_q. A table entry the window released
    (NULL_BLOCK) is written as block 0: in bounds, and no kernel reads it (they start at the
    window), so a stray read could never leave the pool."""
    rows = plan.rows
    T = plan.num_tokens
    S = len(rows)
    G = len(rows[0].block_tables)
    W = max(len(t) for r in rows for t in r.block_tables)
    i64, i32 = torch.int64, torch.int32
    lay = Layout(
        [
            ("ids", T, i64),
            ("pos", T, i64),
            ("slots", G * T, i64),
            ("logits_idx", len(plan.logits), i64),
            ("copies", 2 * len(plan.copies), i64),
            ("seq_lens", S, i32),
            ("cu", S + 1, i32),
            ("tables", G * S * W, i32),
        ]
    )
    buf.reserve(lay.nbytes)
    ids, pos = lay.host(buf, "ids"), lay.host(buf, "pos")
    slots = lay.host(buf, "slots").reshape(G, T)
    seq_lens, cu = lay.host(buf, "seq_lens"), lay.host(buf, "cu")
    tab = lay.host(buf, "tables").reshape(G, S, W)
    tab[:] = 0
    cu[0] = 0
    t = 0
    for r, row in enumerate(rows):
        n = row.num_tokens
        ids[t : t + n] = row.token_ids
        pos[t : t + n] = np.arange(row.start, row.end)
        for g in range(G):
            table = row.block_tables[g]
            slots[g, t : t + n] = row.slots[g]
            tab[g, r, : len(table)] = table
        seq_lens[r] = row.end
        t += n
        cu[r + 1] = t
    np.maximum(tab, 0, out=tab)  # released entries (NULL_BLOCK): block 0, never read
    lay.host(buf, "logits_idx")[:] = [int(cu[lr.row]) + lr.offset for lr in plan.logits]
    if plan.copies:
        lay.host(buf, "copies")[:] = np.asarray(plan.copies, dtype=np.int64).reshape(-1)
    buf.upload(lay.nbytes)
    d = lambda name: lay.dev(buf, name)
    return (
        d("ids"),
        d("pos"),
        d("slots").view(G, T),
        d("tables").view(G, S, W),
        d("seq_lens"),
        d("cu"),
        d("logits_idx"),
        d("copies").view(-1, 2) if plan.copies else None,
        plan.max_num_tokens,
    )
