"""Who is served next: first-come first-served, or fair between tenants (Virtual Token Counter).
The names every part shares (tenants, the policy protocol, FCFS) are in engine/core/tenancy.py.

The scheduler (engine/core/scheduler.py) asks its policy four questions each step, through the
`SchedulingPolicy` protocol: in which order do running sequences take the token budget (the last
one is the memory-pressure victim), which waiting sequence is admitted next, whether a waiting
sequence may take a slot or blocks from a running one, and what the step cost each tenant.

`FairPolicy` is VTC (Sheng et al., OSDI '24) inside the engine:
- every tenant has a virtual counter that grows with the service it receives: prefill tokens
  actually computed (prefix-cache hits are free) times `prefill_cost`, decode tokens times
  `decode_cost`, divided by the tenant's weight; recomputation after a preemption is not charged;
- a waiting request is admitted from the backlogged tenant with the smallest counter; within a
  tenant, arrival order (among requests that arrived in the same step, the longest cached prefix
  first, never ahead of an earlier turn of the same conversation);
- a tenant that returns after idling starts at the smallest counter of the backlogged tenants
  (`lift`): idle time banks no credit;
- running sequences are ordered by (priority, counter): the memory-pressure victim is the newest
  sequence of the tenant furthest ahead, and a waiting request of a tenant below its fair share
  of slots or blocks may preempt a running sequence of a tenant above its share;
- priority classes (lower value first, as vLLM's `priority`) sit on top, with two no-starvation
  rules: while requests of a lower class wait, at least one admission in every `starvation_every`
  goes to the lower class that has waited longest; and no lower-class request that could run
  waits longer than `starvation_wait_s` seconds (issue 48.1): once it has waited that long while
  a higher class waits or runs and its tenant has nothing running, it is admitted next, and if
  no slot or block is free the newest running sequence of a higher class is preempted for it (at
  most one per starved tenant at a time: once it runs, its tenant is served, so no thrash). The first rule alone counts admissions, so long replies of the higher
  class stretched a lower class's wait to minutes; the second bounds the time.
With one tenant and one class it reduces to first-come first-served, except for the same-step
cached-prefix tie-break.
"""

from __future__ import annotations

import math
import time
from collections import deque
from engine.core.sequence import Sequence
from engine.core.tenancy import (
    FairnessEvent,
    FCFSPolicy,
    Occupancy,
    SchedulingPolicy,
    TenantStats,
    priority_of,
    slots_of,
    tenant_of,
)

SHARE_WINDOW_S = 60.0  # "share of tokens in the last minute"
DEFAULT_STARVATION_WAIT_S = (
    5.0  # the longest a runnable lower-class request waits (--starvation-wait)
)


class _Tenant:
    __slots__ = (
        "name",
        "weight",
        "counter",
        "running",
        "waiting",
        "prefill",
        "decode",
        "window",
        "preemptions",
        "held_back",
        "queue_s",
        "queue_n",
        "last_held_event",
    )

    def __init__(self, name: str, weight: float, counter: float):
        self.name, self.weight, self.counter = name, weight, counter
        self.running = self.waiting = 0
        self.prefill = self.decode = 0
        self.window: deque = deque()  # (second, tokens) for the last-minute share
        self.preemptions = self.held_back = 0
        self.queue_s, self.queue_n = 0.0, 0
        self.last_held_event = 0.0

    @property
    def backlogged(self) -> bool:
        return self.running + self.waiting > 0


class FairPolicy:
    """VTC between tenants, priority classes on top (see the module docstring for the rules)."""

    name = "fair"
    preempts_for_fairness = True

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        *,
        prefill_cost: float = 1.0,
        decode_cost: float = 2.0,
        starvation_every: int = 4,
        tie_break_lookups: int = 8,
        starvation_wait_s: float = DEFAULT_STARVATION_WAIT_S,
        clock=time.time,
    ):
        for k, w in (weights or {}).items():
            if not w > 0:
                raise ValueError(f"tenant weight for {k!r} must be > 0, got {w}")
        if starvation_every < 2:
            raise ValueError("starvation_every must be >= 2")
        if not 0 < starvation_wait_s < math.inf:
            raise ValueError(f"starvation_wait_s must be > 0 seconds, got {starvation_wait_s}")
        self.starvation_wait_s = float(starvation_wait_s)
        self._waiting_since: dict[str, float] = {}  # seq id -> clock() when it last began waiting
        self._top_running: int | None = None  # the highest class running (lowest value)
        self.weights = dict(weights or {})
        self.prefill_cost, self.decode_cost = float(prefill_cost), float(decode_cost)
        self.starvation_every = starvation_every
        self.tie_break_lookups = tie_break_lookups
        self.clock = clock
        self.tenants: dict[str, _Tenant] = {}
        self._high_water: dict[str, int] = {}  # seq id -> tokens ever computed (no double charge)
        self._arrival_step: dict[
            str, int
        ] = {}  # seq id -> add() count at arrival (tie-break window)
        self._adds = 0
        self._steps_since_add = 0
        self._top_streak = 0  # admissions in a row to the top class while a lower one waited
        self._admitted_before: set[str] = set()
        self._events: deque = deque(maxlen=50)

    # ---- bookkeeping -------------------------------------------------------------------------
    def _tenant(self, name: str) -> _Tenant:
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = _Tenant(name, float(self.weights.get(name, 1.0)), 0.0)
        return t

    def _floor(self, exclude: str | None = None) -> float | None:
        active = [t.counter for t in self.tenants.values() if t.backlogged and t.name != exclude]
        return min(active) if active else None

    def on_add(self, seq: Sequence) -> None:
        t = self._tenant(tenant_of(seq))
        if not t.backlogged:  # returns after idling: lift, no banked credit
            floor = self._floor(exclude=t.name)
            if floor is not None:
                t.counter = max(t.counter, floor)
        t.waiting += 1
        self._waiting_since[seq.seq_id] = self.clock()
        if self._steps_since_add:
            self._adds += 1
            self._steps_since_add = 0
        self._arrival_step.setdefault(seq.seq_id, self._adds)

    def on_admit(self, seq: Sequence, now: float) -> None:
        t = self._tenant(tenant_of(seq))
        t.waiting -= 1
        t.running += 1
        self._waiting_since.pop(seq.seq_id, None)
        if seq.seq_id not in self._admitted_before and seq.index == 0:
            self._admitted_before.add(seq.seq_id)
            t.queue_s += max(0.0, now - seq.request.arrival_time)
            t.queue_n += 1

    def on_preempt(self, seq: Sequence) -> None:
        t = self._tenant(tenant_of(seq))
        t.running -= 1
        t.waiting += 1
        t.preemptions += 1
        self._waiting_since[seq.seq_id] = self.clock()

    def on_fork(self, seq: Sequence) -> None:
        self._tenant(tenant_of(seq)).running += 1

    def sync(self, running, waiting) -> None:
        """Recount running / waiting per tenant from the scheduler's lists (once per step), so a
        caller that moves sequences directly (beam search re-queues its beams) cannot skew them."""
        for t in self.tenants.values():
            t.running = t.waiting = 0
        for seq in running:
            self._tenant(tenant_of(seq)).running += 1
        for seq in waiting:
            self._tenant(tenant_of(seq)).waiting += 1
        self._top_running = min((priority_of(s) for s in running), default=None)

    def on_remove(self, seq: Sequence, was_running: bool) -> None:
        t = self._tenant(tenant_of(seq))
        if was_running:
            t.running -= 1
        else:
            t.waiting -= 1
        self._high_water.pop(seq.seq_id, None)
        self._arrival_step.pop(seq.seq_id, None)
        self._admitted_before.discard(seq.seq_id)
        self._waiting_since.pop(seq.seq_id, None)

    # ---- decisions ---------------------------------------------------------------------------
    def _key(self, seq: Sequence) -> tuple:
        return priority_of(seq), self._tenant(tenant_of(seq)).counter

    def order_running(self, running: list[Sequence]) -> list[Sequence]:
        """Most deserving first (stable: admission order within a tenant); the last is the victim."""
        return sorted(running, key=self._key)

    def _overdue(self, heads) -> Sequence | None:
        """The longest-waiting head that has waited `starvation_wait_s` while a higher class waits
        or runs and its tenant has nothing running (the time bound of the no-starvation rule: a
        tenant that is being served is not starved; its other requests wait their turn), or None."""
        top = min(priority_of(s) for s in heads)
        if self._top_running is not None:
            top = min(top, self._top_running)
        now, best, since = self.clock(), None, math.inf
        for s in heads:
            t = self._waiting_since.setdefault(s.seq_id, now)
            if (
                priority_of(s) > top
                and now - t >= self.starvation_wait_s
                and t < since
                and not self._tenant(tenant_of(s)).running
            ):
                best, since = s, t
        return best

    def is_overdue(self, seq: Sequence) -> bool:
        """seq has waited past the time bound and its tenant has nothing running (it may preempt
        a higher class, fair_victim)."""
        t = self._waiting_since.get(seq.seq_id)
        return (
            t is not None
            and self.clock() - t >= self.starvation_wait_s
            and not self._tenant(tenant_of(seq)).running
        )

    def pick_waiting(self, waiting, cached_len, starvation: bool = True) -> Sequence | None:
        """The next waiting sequence to admit. cached_len(seq) -> prefix-cache hit length (pure).
        starvation=False: ignore the 1-in-`starvation_every` turn (the scheduler asks so for
        fair-share preemption, which frees a slot for the top-class candidate only); the time
        bound applies either way: an overdue lower-class request is the candidate."""
        self._steps_since_add += 1
        heads: dict[str, Sequence] = {}
        for seq in waiting:
            heads.setdefault(tenant_of(seq), seq)
        if not heads:
            return None
        classes = sorted({priority_of(s) for s in heads.values()})
        pool = [s for s in heads.values() if priority_of(s) == classes[0]]
        overdue = self._overdue(heads.values())
        if overdue is not None:
            return overdue  # its own tenant's head: arrival order kept
        if starvation and len(classes) > 1 and self._top_streak >= self.starvation_every - 1:
            lower = [s for s in heads.values() if priority_of(s) > classes[0]]
            pool = [min(lower, key=lambda s: s.request.arrival_time)]  # longest-waiting lower class
        best = min(
            pool,
            key=lambda s: (
                self._tenant(tenant_of(s)).counter,
                self._tenant(tenant_of(s)).running,
                s.request.arrival_time,
            ),
        )
        return self._tie_break(best, waiting, cached_len)

    def _tie_break(self, head: Sequence, waiting, cached_len) -> Sequence:
        """Among the tenant's requests that arrived in the same step as its head, the longest cached
        prefix first, skipping any with an earlier waiting turn of the same conversation."""
        if head.request.forked or self._high_water.get(head.seq_id):  # preempted: it goes first
            return head
        tenant, stamp = tenant_of(head), self._arrival_step.get(head.seq_id)
        best, best_len, looked = head, None, 0
        sessions_seen: set = set()
        for seq in waiting:
            if tenant_of(seq) != tenant:
                continue
            if self._arrival_step.get(seq.seq_id) != stamp or looked >= self.tie_break_lookups:
                break
            sid = seq.request.session_id
            if sid is not None and sid in sessions_seen:
                continue
            if sid is not None:
                sessions_seen.add(sid)
            if seq.index != 0 or self._high_water.get(seq.seq_id):
                continue
            n = cached_len(seq)
            looked += 1
            if best_len is None or n > best_len:
                best, best_len = seq, n
        return best

    def admitted(self, seq: Sequence, waiting) -> None:
        """After an admission: streak for the no-starvation rule, and a "held back" event when a
        tenant whose request arrived earlier was passed over."""
        p = priority_of(seq)
        others = [s for s in waiting if s is not seq]
        if any(priority_of(s) < p for s in others):
            self._top_streak = 0  # a lower class got its turn
        elif any(priority_of(s) > p for s in others):
            self._top_streak += 1
        else:
            self._top_streak = 0
        me = tenant_of(seq)
        for other in others:
            if other.request.arrival_time < seq.request.arrival_time and tenant_of(other) != me:
                t = self._tenant(tenant_of(other))
                t.held_back += 1
                now = self.clock()
                if now - t.last_held_event >= 5.0:
                    t.last_held_event = now
                    self._events.append(
                        FairnessEvent(
                            now,
                            "held_back",
                            t.name,
                            me,
                            f"held {t.name} back (counter {t.counter:.0f}) to serve {me} "
                            f"(counter {self._tenant(me).counter:.0f})",
                        )
                    )
                break

    def fair_victim(
        self, cand: Sequence, running: list[Sequence], occ: Occupancy, by_blocks: bool
    ) -> Sequence | None:
        """A running sequence `cand` may take over: the newest of the tenant most above its fair
        share of slots (or blocks), if cand's tenant is below its own share and not of a lower class.
        An overdue lower-class cand (the time bound) takes the newest running sequence of a higher
        class instead, whatever the shares."""
        if self.is_overdue(cand):
            for seq in reversed(running):
                if priority_of(seq) < priority_of(cand) and tenant_of(seq) != tenant_of(cand):
                    self._events.append(
                        FairnessEvent(
                            self.clock(),
                            "starvation_preempt",
                            tenant_of(seq),
                            tenant_of(cand),
                            f"preempted {tenant_of(seq)} (priority {priority_of(seq)}) so {tenant_of(cand)} "
                            f"(priority {priority_of(cand)}) waits no more than {self.starvation_wait_s:g} s",
                        )
                    )
                    return seq
        used = occ.blocks if by_blocks else occ.slots
        total = occ.total_blocks if by_blocks else occ.max_slots
        backlogged = [t for t in self.tenants.values() if t.backlogged]
        wsum = sum(t.weight for t in backlogged) or 1.0
        me = self._tenant(tenant_of(cand))
        need = 1 if by_blocks else slots_of(cand)
        if used.get(me.name, 0) + need > total * me.weight / wsum:
            return None
        best, best_ratio = None, 1.0
        for t in backlogged:
            if t.name == me.name:
                continue
            share = total * t.weight / wsum
            ratio = used.get(t.name, 0) / share if share > 0 else math.inf
            if ratio > best_ratio:
                best, best_ratio = t, ratio
        if best is None:
            return None
        for seq in reversed(running):
            if tenant_of(seq) == best.name and priority_of(seq) >= priority_of(cand):
                self._events.append(
                    FairnessEvent(
                        self.clock(),
                        "fair_preempt",
                        best.name,
                        me.name,
                        f"preempted {best.name} (above its fair share of "
                        f"{'blocks' if by_blocks else 'slots'}) to serve {me.name}",
                    )
                )
                return seq
        return None

    def charge(self, plan) -> None:
        """Add this step's service (a StepPlan) to each tenant's counter: new prefill and decode
        tokens only."""
        now = int(self.clock())
        for row in plan.rows:
            seq, start, n = row.seq, row.start, row.num_tokens
            hw = self._high_water.get(seq.seq_id, 0)
            lo, hi = max(start, hw), start + n
            if hi <= lo:
                continue
            self._high_water[seq.seq_id] = hi
            plen = seq.prompt_len
            prefill = max(0, min(hi, plen) - lo)
            decode = (hi - lo) - prefill
            t = self._tenant(tenant_of(seq))
            t.prefill += prefill
            t.decode += decode
            t.counter += (prefill * self.prefill_cost + decode * self.decode_cost) / t.weight
            if t.window and t.window[-1][0] == now:
                t.window[-1] = (now, t.window[-1][1] + hi - lo)
            else:
                t.window.append((now, hi - lo))

    # ---- reporting (ReportsTenants) -------------------------------------------------------------
    def tenant_stats(self) -> list[TenantStats]:
        now = self.clock()
        recent = {}
        for t in self.tenants.values():
            while t.window and t.window[0][0] < now - SHARE_WINDOW_S:
                t.window.popleft()
            recent[t.name] = sum(n for _, n in t.window)
        total = sum(recent.values()) or 1
        return [
            TenantStats(
                t.name,
                t.weight,
                t.counter,
                t.running,
                t.waiting,
                t.prefill,
                t.decode,
                recent[t.name],
                recent[t.name] / total,
                t.preemptions,
                t.held_back,
                t.queue_s,
                t.queue_n,
            )
            for t in sorted(self.tenants.values(), key=lambda t: t.name)
        ]

    def events(self) -> list[FairnessEvent]:
        return list(self._events)


def make_policy(name: str, weights: dict[str, float] | None = None, **kw) -> SchedulingPolicy:
    if name == "fcfs":
        return FCFSPolicy()  # arrival order: no classes, nothing to bound
    if name == "fair":
        return FairPolicy(weights, **kw)
    raise ValueError(f"scheduling policy must be 'fair' or 'fcfs', got {name!r}")
