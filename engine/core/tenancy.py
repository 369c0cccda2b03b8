"""Tenants and the scheduling-policy contract: who a sequence belongs to, what the scheduler asks
its policy (`SchedulingPolicy`), what a policy reports (`TenantStats`, `FairnessEvent`), and the
plain first-come first-served policy.

Why apart from engine/core/fairness.py: the scheduler, the front, the routes and the dashboard
need these names; only the engine's start-up needs the fair policy itself (VTC, fairness.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.core.sequence import Sequence

LOCAL_TENANT = "local"  # the single user of a local app without --auth
KEYLESS_API_TENANT = "api"  # /v1 calls on a server that asks for no key


def slots_of(seq: Sequence) -> int:
    """Sequences a running entry will occupy: a request with n > 1 forks into n after prefill."""
    req = seq.request
    return req.params.n if seq.index == 0 and not req.forked else 1


def tenant_of(seq: Sequence) -> str:
    return seq.request.tenant or LOCAL_TENANT


def priority_of(seq: Sequence) -> int:
    return int(seq.request.priority or 0)


@dataclass(frozen=True)
class Occupancy:
    """What the running sequences hold, per tenant, when a waiting one is blocked."""

    slots: dict[str, int]
    blocks: dict[str, int]
    max_slots: int
    total_blocks: int


@dataclass
class TenantStats:
    """One row of the Memory tab's "who is served" panel and of /metrics."""

    tenant: str
    weight: float
    counter: float
    running: int = 0
    waiting: int = 0
    prefill_tokens: int = 0  # computed (not cached) prompt tokens, all time
    decode_tokens: int = 0
    tokens_last_minute: int = 0
    share_last_minute: float = 0.0
    preemptions: int = 0  # preemptions this tenant suffered
    held_back: int = 0  # admissions where this tenant was passed over for a fairer one
    queue_time_s_total: float = 0.0  # arrival -> first admission, summed over requests
    queue_time_count: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FairnessEvent:
    """A decision worth a line in the dashboard's event feed."""

    t: float
    kind: str  # "held_back" | "fair_preempt" | "starvation_preempt"
    tenant: str  # the tenant held back or preempted
    favoured: str  # the tenant served instead
    text: str


@runtime_checkable
class SchedulingPolicy(Protocol):
    name: str
    preempts_for_fairness: bool  # False: the scheduler never asks fair_victim

    def on_add(self, seq: Sequence) -> None: ...
    def on_fork(self, seq: Sequence) -> None: ...
    def sync(self, running, waiting) -> None: ...
    def admitted(self, seq: Sequence, waiting) -> None: ...
    def on_admit(self, seq: Sequence, now: float) -> None: ...
    def on_preempt(self, seq: Sequence) -> None: ...
    def on_remove(self, seq: Sequence, was_running: bool) -> None: ...
    def order_running(self, running: list[Sequence]) -> list[Sequence]: ...
    def pick_waiting(self, waiting, cached_len, starvation: bool = True) -> Sequence | None: ...
    def fair_victim(
        self, cand: Sequence, running: list[Sequence], occ: Occupancy, by_blocks: bool
    ) -> Sequence | None: ...
    def charge(self, plan) -> None: ...


@runtime_checkable
class ReportsTenants(Protocol):
    """An optional ability: per-tenant rows and decision events for the dashboard and /metrics."""

    def tenant_stats(self) -> list[TenantStats]: ...
    def events(self) -> list[FairnessEvent]: ...


class FCFSPolicy:
    """Arrival order, admission order, newest running sequence is the victim (the old behaviour)."""

    name = "fcfs"
    preempts_for_fairness = False

    def on_add(self, seq):
        pass

    def on_fork(self, seq):
        pass

    def sync(self, running, waiting):
        pass

    def admitted(self, seq, waiting):
        pass

    def on_admit(self, seq, now):
        pass

    def on_preempt(self, seq):
        pass

    def on_remove(self, seq, was_running):
        pass

    def order_running(self, running):
        return running

    def pick_waiting(self, waiting, cached_len, starvation=True):
        return waiting[0] if waiting else None

    def fair_victim(self, cand, running, occ, by_blocks):
        return None

    def charge(self, plan):
        pass
