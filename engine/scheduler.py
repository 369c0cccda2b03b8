"""Continuous batching: each step picks which sequences advance and by how many tokens.

Policy (vLLM-like): running sequences first, in admission order, each asking for all its
uncomputed tokens (1 when decoding, a chunk when prefilling) within the step's token budget; then
waiting sequences are admitted in arrival order while the budget, `max_num_seqs` and the pool
allow. When the pool cannot grow a running sequence, the most recently admitted one is preempted
by recompute: its blocks are freed (they stay in the prefix cache) and it goes back to the front
of the queue with every generated token kept. Each preempted sequence is also recorded for the
engine (`take_preempted`), which tells that request's stream it is paused.
"""
from __future__ import annotations

from collections import deque

from engine.errors import NoFreeBlocksError
from engine.kv_cache_manager import KVCacheManager
from engine.sequence import Sequence, SeqStatus


def _slots(seq: Sequence) -> int:
    """Sequences a running entry will occupy: a request with n > 1 forks into n after prefill."""
    req = seq.request
    return req.params.n if seq.index == 0 and not req.forked else 1


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.peak_running = 0
        self._preempted: list[Sequence] = []    # preempted since the engine last asked

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence that finished or was aborted (the caller frees its blocks)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.preempt(seq.seq_id)          # the manager counts it and logs the victim and tokens lost
        self.running.remove(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self._preempted.append(seq)

    def take_preempted(self) -> list[Sequence]:
        """The sequences preempted since the last call (the engine signals their streams)."""
        out, self._preempted = self._preempted, []
        return out

    def waiting_request_ids(self) -> list[str]:
        """Request ids in the order the waiting queue will admit them (each once): what a
        "queued, position k" line counts, whoever submitted the requests (chat or API)."""
        seen: dict[str, None] = {}
        for seq in self.waiting:
            seen.setdefault(seq.request.request_id, None)
        return list(seen)

    def schedule(self) -> list[tuple[Sequence, int, int]]:
        """Return [(seq, first_position, num_new_tokens)] for this step; the manager is updated."""
        budget = self.max_num_batched_tokens
        batch: list[tuple[Sequence, int, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            start = self.kv.num_computed(seq.seq_id)     # the manager owns this count
            n = min(len(seq.token_ids) - start, budget)
            while True:
                try:
                    self.kv.allocate_slots(seq.seq_id, n)
                    break
                except NoFreeBlocksError:
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
            if seq.status is not SeqStatus.RUNNING:
                break
            batch.append((seq, start, n))
            budget -= n
            i += 1
        if preempted:
            return batch
        taken = sum(map(_slots, self.running))
        while self.waiting and budget > 0 and taken < self.max_num_seqs:
            seq = self.waiting[0]
            req = seq.request
            if self.running and taken + _slots(seq) > self.max_num_seqs:
                break                   # alone, an n > max_num_seqs request still runs
            session = req.session_id if seq.index == 0 else None
            try:     # one prefix lookup: the manager clamps the budget to what is not cached
                cached = self.kv.add_sequence(seq.seq_id, seq.token_ids, num_new_tokens=budget,
                                              cache_salt=req.cache_salt, session_id=session)
            except NoFreeBlocksError:
                break
            n = min(budget, len(seq.token_ids) - cached)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            seq.cached_tokens = cached if seq.first_token_time is None else seq.cached_tokens
            self.running.append(seq)
            taken += _slots(seq)
            batch.append((seq, cached, n))
            budget -= n
        self.peak_running = max(self.peak_running, len(self.running))
        return batch

    def add_forked(self, parent: Sequence, child: Sequence) -> None:
        """A child forked from a running parent runs right after it."""
        child.status = SeqStatus.RUNNING
        self.running.insert(self.running.index(parent) + 1, child)
        self.peak_running = max(self.peak_running, len(self.running))
