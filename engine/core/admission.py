"""Admission bounds: how many requests (and prompt tokens) may wait, per tenant and overall.

A request counts as queued from `LLM.submit` until the engine first reports on it (admitted, or
finished / failed); past a bound, `enter` raises `QueueFull` at once, before anything is queued,
so a flood gets a clear "busy" answer (429 + Retry-After on /v1, a sentence in the chat) instead
of waiting forever. Callers in any thread; one lock, O(1) per call.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueBounds:
    """None: unbounded. Per-tenant bounds apply to each tenant separately."""

    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    tenant_max_queued_requests: int | None = None
    tenant_max_queued_tokens: int | None = None

    def __post_init__(self):
        for k, v in self.__dict__.items():
            if v is not None and v < 1:
                raise ValueError(f"{k} must be >= 1 (or None), got {v}")


class QueueFull(RuntimeError):
    """Over an admission bound. `retry_after_s`: a hint for Retry-After; `scope`: tenant | server."""

    def __init__(self, message: str, retry_after_s: int, scope: str, queued: int):
        super().__init__(message)
        self.retry_after_s, self.scope, self.queued = retry_after_s, scope, queued


class AdmissionControl:
    def __init__(self, bounds: QueueBounds | None = None, drain_per_s: float = 4.0):
        self.bounds = bounds or QueueBounds()
        self.drain_per_s = drain_per_s  # requests leaving the queue per second, for Retry-After
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, int]] = {}  # request id -> (tenant, tokens)
        self._req: dict[str, int] = {}
        self._tok: dict[str, int] = {}
        self._total_req = 0
        self._total_tok = 0

    def _retry(self, queued: int) -> int:
        return max(1, math.ceil(queued / self.drain_per_s))

    def enter(self, request_id: str, tenant: str, tokens: int) -> int:
        """Count a request as queued; returns its 1-based place among all queued requests.
        Raises QueueFull (nothing counted) when a bound would be passed."""
        b = self.bounds
        with self._lock:
            treq, ttok = self._req.get(tenant, 0), self._tok.get(tenant, 0)
            if b.tenant_max_queued_requests is not None and treq + 1 > b.tenant_max_queued_requests:
                raise QueueFull(
                    f"you already have {treq} requests waiting (bound "
                    f"{b.tenant_max_queued_requests} per user); wait for one to start",
                    self._retry(treq),
                    "tenant",
                    treq,
                )
            if (
                b.tenant_max_queued_tokens is not None
                and ttok + tokens > b.tenant_max_queued_tokens
            ):
                raise QueueFull(
                    f"your waiting requests would hold {ttok + tokens} prompt tokens (bound "
                    f"{b.tenant_max_queued_tokens} per user); wait for one to start",
                    self._retry(treq + 1),
                    "tenant",
                    treq,
                )
            if b.max_queued_requests is not None and self._total_req + 1 > b.max_queued_requests:
                raise QueueFull(
                    f"the server is busy: {self._total_req} requests are waiting (bound "
                    f"{b.max_queued_requests})",
                    self._retry(self._total_req),
                    "server",
                    self._total_req,
                )
            if b.max_queued_tokens is not None and self._total_tok + tokens > b.max_queued_tokens:
                raise QueueFull(
                    f"the server is busy: waiting requests would hold {self._total_tok + tokens} "
                    f"prompt tokens (bound {b.max_queued_tokens})",
                    self._retry(self._total_req + 1),
                    "server",
                    self._total_req,
                )
            self._entries[request_id] = (tenant, tokens)
            self._req[tenant] = treq + 1
            self._tok[tenant] = ttok + tokens
            self._total_req += 1
            self._total_tok += tokens
            return self._total_req

    def leave(self, request_id: str) -> None:
        """The request started (or ended); idempotent."""
        with self._lock:
            entry = self._entries.pop(request_id, None)
            if entry is None:
                return
            tenant, tokens = entry
            self._req[tenant] -= 1
            self._tok[tenant] -= tokens
            if not self._req[tenant]:
                del self._req[tenant], self._tok[tenant]
            self._total_req -= 1
            self._total_tok -= tokens

    def queued(self, tenant: str | None = None) -> tuple[int, int]:
        """(requests, prompt tokens) queued, for one tenant or overall."""
        with self._lock:
            if tenant is None:
                return self._total_req, self._total_tok
            return self._req.get(tenant, 0), self._tok.get(tenant, 0)
