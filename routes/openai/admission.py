"""Who may start API sequences now: the /v1 queue bounds, per key first, then the server's.

Why a module of its own: the same rule answers twice, before a body is parsed (the pre-parse gate,
routes/security/request_limits.py) and in the route (which reserves the slots), and the two once disagreed:
the gate counted every key's sequences while the route counted each key's own, so key alpha
holding its bound made every call of key beta 429 before the fair scheduler ever saw it (issue
48.3). Bounds: at most `max_pending` API sequences (n per prompt) in flight and fewer than
`max_num_seqs` requests waiting; under fair scheduling both are per key (tenant), and the 429 names
the key's own bound; the engine's admission bounds (--max-queued-*, per tenant first, then
overall) come after, at submit. Under FCFS the bounds are the server's (no tenants).
"""

from __future__ import annotations

import threading

from routes.openai.errors import APIError


class ApiAdmission:
    def __init__(self, llm, metrics, *, max_pending: int, max_num_seqs: int, per_tenant: bool):
        self.llm, self.metrics = llm, metrics
        self.max_pending, self.max_num_seqs, self.per_tenant = max_pending, max_num_seqs, per_tenant
        self._flight: dict[str, int] = {}
        self._lock = threading.Lock()

    def refusal(self, seqs: int, tenant: str) -> str | None:
        """Why `seqs` more sequences of `tenant` cannot start now, or None (nothing reserved).
        APIError(503) when the engine is not serving."""
        try:
            waiting = self.llm.load()[1]
        except RuntimeError as e:
            raise APIError(503, f"the engine is not serving: {e}", code="engine_unavailable") from e
        if self.per_tenant:
            mine_waiting = self.llm.admission.queued(tenant)[0]
            with self._lock:
                mine = self._flight.get(tenant, 0)
            if mine + seqs > self.max_pending:
                return (
                    f"your key ({tenant}) already has {mine} API sequences in flight and asks "
                    f"for {seqs} more (bound {self.max_pending} per key); retry when one "
                    f"finishes"
                )
            if mine_waiting >= self.max_num_seqs:
                return (
                    f"your key ({tenant}) already has {mine_waiting} requests waiting (bound "
                    f"{self.max_num_seqs} per key); retry shortly"
                )
            return None
        if waiting >= self.max_num_seqs or self.metrics.in_flight + seqs > self.max_pending:
            return (
                f"the server is busy ({waiting} requests waiting, bound {self.max_num_seqs}; "
                f"API sequences in flight bound {self.max_pending}); retry shortly"
            )
        return None

    def admit(self, seqs: int, tenant: str) -> None:
        """Reserve `seqs` in-flight slots for `tenant`, or APIError(429) naming the bound."""
        reason = self.refusal(seqs, tenant)
        if reason is None and self.per_tenant:
            with self._lock:  # reserve, re-checked under the lock (calls at once)
                mine = self._flight.get(tenant, 0)
                if mine + seqs <= self.max_pending:
                    self._flight[tenant] = mine + seqs
                else:
                    reason = (
                        f"your key ({tenant}) already has {mine} API sequences in flight "
                        f"(bound {self.max_pending} per key); retry when one finishes"
                    )
            if reason is None:
                self.metrics.try_admit(seqs, 10**9)  # the gauge only: no global bound here
        elif reason is None and not self.metrics.try_admit(seqs, self.max_pending):
            reason = (
                f"the server is busy (API sequences in flight bound {self.max_pending}); "
                f"retry shortly"
            )
        if reason is not None:
            raise APIError(429, reason, code="queue_full", headers={"Retry-After": "1"})

    def release(self, seqs: int, tenant: str, usage: dict | None = None) -> None:
        """Give back what admit reserved (once per admitted call)."""
        if self.per_tenant:
            with self._lock:
                left = self._flight.get(tenant, 0) - seqs
                if left > 0:
                    self._flight[tenant] = left
                else:
                    self._flight.pop(tenant, None)
        self.metrics.release(seqs, usage)
