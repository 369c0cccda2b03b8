"""CUDA graphs for decode steps, one per batch-size bucket (1, 2, 4, ... up to max_num_seqs).

Why: a decode step is ~300 kernel launches even with the fused layer ops; at batch 1 the CPU
cannot issue them as fast as the GPU runs them. A graph replays the whole forward with one launch.
A graph reads and writes fixed addresses with fixed shapes, so each bucket is captured over
static input tensors sized for the largest bucket:
- the batch is padded up to its bucket: pad rows decode token 0 at position 0 with slot -1 (no
  KV store) and a context of 1 through block 0 (a real block, so every read is in bounds); their
  logits are dropped;
- block tables have a fixed width (graph_max_len / block_size); entries past a sequence's last
  block are never read (attention masks by context length), so they are not even cleared;
- KV cache groups (engine/kv/cache_spec.py): one slot row and one table per group, the window's
  released entries written as block 0 (never read, as in engine/exec/step_inputs.py);
- the split-K count follows from that fixed width, so it is fixed per bucket.
Inputs reach the static tensors through one pinned staging buffer and one non-blocking copy
(engine/exec/step_inputs.py). Buckets are captured largest first so they share one memory pool.
A step that is not pure decode, or is larger / longer than the graphs, runs eagerly.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from engine.exec.models.llama import AttentionMetadata
from engine.exec.step_inputs import Layout, StagingBuffer
from engine.step_plan import StepPlan

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def bucket_sizes(max_batch: int) -> list[int]:
    return [b for b in BUCKETS if b < max_batch] + [max_batch]


class DecodeGraphs:
    def __init__(
        self,
        model,
        kv_pool: torch.Tensor,
        block_size: int,
        max_batch: int,
        max_len: int,
        backend: str,
    ):
        self.model, self.kv_pool, self.bs, self.backend = model, kv_pool, block_size, backend
        self.buckets = bucket_sizes(max_batch)
        self.bmax = max_batch
        self.max_len = max_len
        self.width = -(-max_len // block_size)
        self.groups = G = 1 + max(g for _, g in model.kv_layer)  # KV cache groups
        dev = kv_pool.device
        i64, i32 = torch.int64, torch.int32
        self.layout = Layout(
            [
                ("ids", self.bmax, i64),
                ("pos", self.bmax, i64),
                ("slots", G * self.bmax, i64),
                ("seq_lens", self.bmax, i32),
                ("tables", G * self.bmax * self.width, i32),
            ]
        )
        self.buf = StagingBuffer(dev, self.layout.nbytes)
        L, b = self.layout, self.buf
        self.h_ids, self.h_pos = L.host(b, "ids"), L.host(b, "pos")
        self.h_slots = L.host(b, "slots").reshape(G, self.bmax)
        self.h_lens = L.host(b, "seq_lens")
        self.h_tab = L.host(b, "tables").reshape(G, self.bmax, self.width)
        self.ids, self.pos = L.dev(b, "ids"), L.dev(b, "pos")
        self.slots = L.dev(b, "slots").view(G, self.bmax)
        self.seq_lens = L.dev(b, "seq_lens")
        self.tables = L.dev(b, "tables").view(G, self.bmax, self.width)
        self.cu = torch.arange(self.bmax + 1, dtype=i32, device=dev)
        self.logits_idx = torch.arange(self.bmax, dtype=i64, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _meta(self, B: int) -> AttentionMetadata:
        groups = self.groups > 1
        return AttentionMetadata(
            slot_mapping=self.slots[0, :B],
            block_tables=self.tables[0, :B],
            seq_lens=self.seq_lens[:B],
            cu_seqlens_q=self.cu[: B + 1],
            max_seqlen_q=1,
            backend=self.backend,
            group_slots=self.slots[:, :B] if groups else None,
            group_tables=self.tables[:, :B] if groups else None,
        )

    def _forward(self, B: int) -> torch.Tensor:
        return self.model.forward(
            self.ids[:B], self.pos[:B], self.kv_pool, self._meta(B), self.logits_idx[:B]
        )

    def _fill_pads(self, start: int, end: int) -> None:
        self.h_ids[start:end] = 0
        self.h_pos[start:end] = 0
        self.h_slots[:, start:end] = -1
        self.h_lens[start:end] = 1
        self.h_tab[:, start:end, 0] = 0

    def capture(self, log=None) -> float:
        """Capture every bucket (largest first, one shared memory pool). Returns seconds taken."""
        log = log or (lambda m: print(f"[cuda-graphs] {m}", file=sys.stderr, flush=True))
        t0 = time.perf_counter()
        self.buf.reserve(self.layout.nbytes)
        self._fill_pads(0, self.bmax)
        self.h_tab[:] = 0
        self.buf.upload(self.layout.nbytes)
        if self.kv_pool.device.type != "cuda":
            # CPU (tests): no graphs; replay runs the same padded forward eagerly over the static
            # buffers, so the bucket/padding/table logic is checked without a GPU
            self.graphs = {B: (None, None) for B in self.buckets}
            return time.perf_counter() - t0
        torch.cuda.synchronize()
        pool = None
        for i, B in enumerate(reversed(self.buckets)):
            self._forward(B)  # eager once: compiles and autotunes outside capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = self._forward(B)
            pool = g.pool()
            self.graphs[B] = (g, out)
            log(f"captured batch {B} ({i + 1}/{len(self.buckets)})")
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def can_run(self, plan: StepPlan) -> bool:
        return (
            bool(self.graphs)
            and 0 < len(plan) <= self.bmax
            and plan.is_pure_decode
            and all(row.start < self.max_len for row in plan.rows)
        )

    def run(self, plan: StepPlan) -> torch.Tensor | None:
        """Replay the bucket for this pure-decode step; returns logits [len(plan), vocab] (a view
        of the graph's output, valid until the next replay), or None (nothing done) if a block
        table is wider than the graphs' tables."""
        rows = plan.rows
        n = len(rows)
        B = next(b for b in self.buckets if b >= n)
        if any(len(t) > self.width for row in rows for t in row.block_tables):
            return None
        self.buf.reserve(self.layout.nbytes)  # previous step's copy must be done
        for r, row in enumerate(rows):
            self.h_ids[r] = row.token_ids[0]
            self.h_pos[r] = row.start
            self.h_lens[r] = row.end
            for g, table in enumerate(row.block_tables):
                self.h_slots[g, r] = row.slots[g][0]
                self.h_tab[g, r, : len(table)] = table
        np.maximum(self.h_tab[:, :n], 0, out=self.h_tab[:, :n])  # released entries: block 0
        self._fill_pads(n, B)
        off_tab = self.layout.fields["tables"][0]
        # everything up to row B of the last group's table
        self.buf.upload(off_tab + ((self.groups - 1) * self.bmax + B) * self.width * 4)
        g, out = self.graphs[B]
        if g is None:
            return self._forward(B)[:n]
        g.replay()
        return out[:n]
