"""Continuous batching: each step picks which sequences advance and by how many tokens.

Mechanism (vLLM-like): running sequences first, each asking for all its uncomputed tokens (1 when
decoding, a chunk when prefilling) within the step's token budget; then waiting sequences are
admitted while the budget, `max_num_seqs` and the pool allow. When the pool cannot grow a running
sequence, the last one in running order is preempted by recompute: its blocks are freed (they stay
in the prefix cache) and it goes back to the front of the queue with every generated token kept.
Each preempted sequence is also recorded for the engine (`take_preempted`), which tells that
request's stream it is paused.

Policy (engine/core/fairness.py) decides the orders: with `FCFSPolicy`, admission order and arrival
order (the newest running sequence is the victim); with `FairPolicy`, per-tenant virtual token
counters and priority classes, and a waiting request of a tenant below its fair share may take a
slot or blocks from a tenant above it (at the start of a step, so no victim is ever in the batch).
"""

from __future__ import annotations

import time
from collections import deque

from engine.core.sequence import Sequence, SeqStatus
from engine.core.tenancy import FCFSPolicy, Occupancy, SchedulingPolicy, slots_of, tenant_of
from engine.kv.kv_cache_manager import KVCacheManager
from engine.sampling import prompt_logprobs
from engine.step_plan import LogitsRow, ScheduledRow, StepPlan


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: SchedulingPolicy | None = None,
    ):
        self.kv = kv
        self.layout = kv.layout  # KV cache groups (engine/kv/cache_spec.py)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy: SchedulingPolicy = policy or FCFSPolicy()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.peak_running = 0
        self._preempted: list[Sequence] = []  # preempted since the engine last asked
        self._reserved: list[Sequence] = []  # waiting sequences a fair preemption freed room for

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.policy.on_add(seq)
        self.waiting.append(seq)

    def requeue_first(self, seq: Sequence) -> None:
        """Put a sequence that holds no KV at the head of the waiting queue (a driven request's
        sequence released while its siblings caught up: it is recomputed first)."""
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence that finished or was aborted (the caller frees its blocks)."""
        if seq in self.running:
            self.running.remove(seq)
            self.policy.on_remove(seq, True)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.policy.on_remove(seq, False)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.preempt(seq.seq_id)  # the manager counts it and logs the victim and tokens lost
        seq.draft = []
        self.running.remove(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self._preempted.append(seq)
        self.policy.on_preempt(seq)

    def take_preempted(self) -> list[Sequence]:
        """The sequences preempted since the last call (the engine signals their streams)."""
        out, self._preempted = self._preempted, []
        return out

    def waiting_request_ids(self) -> list[str]:
        """Request ids in the order the waiting queue will admit them (each once): what a
        "queued, position k" line counts, whoever submitted the requests (chat or API).
        Under the fair policy this is arrival order, an estimate of the admission order."""
        seen: dict[str, None] = {}
        for seq in self.waiting:
            seen.setdefault(seq.request.request_id, None)
        return list(seen)

    def _cached_len(self, seq: Sequence) -> int:
        req = seq.request
        return self.kv.lookup_prefix(
            seq.token_ids,
            cache_salt=req.cache_salt,
            session_id=req.session_id if seq.index == 0 else None,
        )

    def _occupancy(self, reserved=()) -> Occupancy:
        """Slots and blocks held per tenant; `reserved` (admitted next) count as holding their slots."""
        slots: dict[str, int] = {}
        blocks: dict[str, int] = {}
        for seq in reserved:
            slots[tenant_of(seq)] = slots.get(tenant_of(seq), 0) + slots_of(seq)
        for seq in self.running:
            t = tenant_of(seq)
            slots[t] = slots.get(t, 0) + slots_of(seq)
            blocks[t] = blocks.get(t, 0) + self.kv.num_blocks_held(seq.seq_id)
        return Occupancy(slots, blocks, self.max_num_seqs, self.kv.num_blocks)

    def _fair_preemptions(self) -> None:
        """A waiting request blocked by slots or blocks may preempt a running sequence of a tenant
        above its fair share (the policy decides; FCFS never does). At most a few per step."""
        waiting = deque(self.waiting)
        for _ in range(4):
            if not waiting or not self.running:
                return
            cand = self.policy.pick_waiting(waiting, self._cached_len, starvation=False)
            if cand is None:
                return
            taken = sum(map(slots_of, self.running)) + sum(map(slots_of, self._reserved))
            by_slots = taken + slots_of(cand) > self.max_num_seqs
            todo = len(cand.token_ids) - self._cached_len(
                cand
            )  # blocks it needs, every KV cache group
            need = sum(
                g.blocks_held(todo, self.kv.block_size, self.max_num_batched_tokens)
                for g in self.layout.groups
            )
            by_blocks = not by_slots and need > self.kv.num_free_blocks
            if not (by_slots or by_blocks):
                return
            victim = self.policy.fair_victim(
                cand, self.running, self._occupancy(self._reserved), by_blocks
            )
            if victim is None:
                return
            self._preempt(victim)
            self._reserved.append(cand)  # the freed room is cand's, not the victim's back
            waiting.remove(cand)

    def schedule(self) -> StepPlan:
        """Decide this step (the manager is updated) and return it as a StepPlan
        (engine/step_plan.py): rows, their block tables and slots, the logits rows, the copies."""
        self.policy.sync(self.running, self.waiting)
        self.running = self.policy.order_running(self.running)
        if self.policy.preempts_for_fairness:
            self._fair_preemptions()
        plan = self._plan(self._schedule())
        self.policy.charge(plan)
        self.policy.sync(self.running, self.waiting)
        return plan

    def _plan(self, batch: list[tuple[Sequence, int, int]]) -> StepPlan:
        """Fill the step's plan from the chosen chunks: the data execution reads, so the runner
        never asks the KV manager. A row whose chunk reaches the end of its sequence's tokens
        samples its last real token; past the end (a speculative step) each draft token's logits
        verify the next draft. Copy-on-write copies are taken only with a non-empty step (an
        empty step leaves them queued for the next one)."""
        kv = self.kv
        rows: list[ScheduledRow] = []
        logits: list[LogitsRow] = []
        for r, (seq, start, n) in enumerate(batch):
            end = start + n
            toks = seq.token_ids
            ids = (
                toks[start:end] if end <= len(toks) else toks[start:] + seq.draft[: end - len(toks)]
            )
            tables, slots = kv.step_kv(seq.seq_id, start, end)
            rows.append(
                ScheduledRow(
                    seq.seq_id, seq, start, n, ids, tables, slots, kv.step_state(seq.seq_id)
                )
            )
            past = end - len(toks)  # >= 0: the chunk reaches the sequence's last token
            if past >= 0:
                logits.append(LogitsRow(r, n - 1 - past, "sample"))
                logits.extend(LogitsRow(r, n - past + j, "draft") for j in range(past))
        plan = StepPlan(rows, logits)
        plan.logits.extend(prompt_logprobs.positions(plan))
        if rows:
            plan.copies = kv.take_pending_copies()
            plan.state_copies = kv.take_state_copies()
        return plan

    def _schedule(self) -> list[tuple[Sequence, int, int]]:
        budget = self.max_num_batched_tokens
        batch: list[tuple[Sequence, int, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            start = self.kv.num_computed(seq.seq_id)  # the manager owns this count
            n = self.kv.chunk_end(seq.seq_id, start, min(len(seq.token_ids) - start, budget))
            if seq.draft:  # speculative: the last token + its draft, if budget and pool allow
                k = min(len(seq.draft), budget - 1) if len(seq.token_ids) - start == 1 else 0
                if k > 0 and self.kv.try_allocate_slots(seq.seq_id, 1 + k):
                    del seq.draft[k:]
                    batch.append((seq, start, 1 + k))
                    budget -= 1 + k
                    i += 1
                    continue
                seq.draft = []  # no room for the draft: the plain step below
            # No room is an answer, not an error: preempt (newest, or under the fair policy the
            # newest of the tenant furthest ahead) until this sequence fits or was the victim.
            while not self.kv.try_allocate_slots(seq.seq_id, n):
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
        taken = sum(map(slots_of, self.running))
        reserved, self._reserved = [s for s in self._reserved if s.status is SeqStatus.WAITING], []
        while self.waiting and budget > 0 and taken < self.max_num_seqs:
            seq = (
                reserved.pop(0)
                if reserved
                else self.policy.pick_waiting(self.waiting, self._cached_len)
            )
            req = seq.request
            if self.running and taken + slots_of(seq) > self.max_num_seqs:
                break  # alone, an n > max_num_seqs request still runs
            session = req.session_id if seq.index == 0 else None
            # one prefix lookup: the manager clamps the budget to what is not cached
            cached = self.kv.try_add_sequence(
                seq.seq_id,
                seq.token_ids,
                num_new_tokens=budget,
                cache_salt=req.cache_salt,
                session_id=session,
            )
            if cached is None:
                break  # no room now: it waits (running sequences free blocks)
            n = (
                self.kv.num_computed(seq.seq_id) - cached
            )  # what the manager gave slots (a chunk may
            # end early at a state checkpoint: engine/kv/state_groups.py)
            self.policy.admitted(seq, self.waiting)
            if self.waiting[0] is seq:
                self.waiting.popleft()
            else:
                self.waiting.remove(seq)
            seq.status = SeqStatus.RUNNING
            seq.cached_tokens = cached if seq.first_token_time is None else seq.cached_tokens
            self.running.append(seq)
            self.policy.on_admit(seq, time.time())
            taken += slots_of(seq)
            batch.append((seq, cached, n))
            budget -= n
        self.peak_running = max(self.peak_running, len(self.running))
        return batch

    def add_forked(self, parent: Sequence, child: Sequence) -> None:
        """A child forked from a running parent runs right after it."""
        child.status = SeqStatus.RUNNING
        self.running.insert(self.running.index(parent) + 1, child)
        self.policy.on_fork(child)
        self.peak_running = max(self.peak_running, len(self.running))
