"""One KV snapshot per period, shared by every reader, with each of its JSON forms built once.

Why: the dashboard ticks of many viewers, /api/kv and /metrics all want "the pool now", and at GPU
pool sizes the reader-side work is the expensive part (a 350k-block pool: ~0.3 s to build the
full v3-compatible dict, ~0.5 s more to serialize 13 MB). Taking the snapshot costs the engine
thread about a millisecond (engine/observe/kv_contract.py), but building its forms holds the GIL, which
the engine thread needs too: so the work must not repeat per viewer. Here a period's snapshot is
taken once (on the first request in that period, never on a timer), and its forms (full or
compact dict, and their UTF-8 JSON bytes) are built on the first request for each, under a lock
of their own, then reused until the period ends. A compact reader never waits for a full build.

The period stretches with the work: a window lasts at least `cost_factor` (4) times what its
forms took to build on readers' threads, so viewers polling a 350k-block pool's full form (about a
second of GIL-holding work) cost the process at most ~25% of a core, leaving the GIL to the engine
thread; at dashboard pool sizes (milliseconds) the window stays at period_s.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout


def json_bytes(d: dict) -> bytes:
    """The JSON body as Starlette's JSONResponse would render it (compact separators, UTF-8)."""
    return json.dumps(
        d, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


class _Period:
    __slots__ = ("snap", "taken", "forms", "locks", "cost")

    def __init__(self, snap, taken: float, cost: float):
        self.snap, self.taken, self.cost = snap, taken, cost
        self.forms: dict = {}
        self.locks = {
            key: threading.Lock() for key in ("dict", "dict-compact", "bytes", "bytes-compact")
        }


class SharedSnapshot:
    """`take()` returns a typed KVSnapshot (it runs on the engine thread between two steps).

    Readers never wait behind compute (issue 26.7): a take that is due runs on a thread of its own,
    and a reader waits for it at most `max_wait_s`; if the engine is inside a long step (a cold
    burst's prefill can take seconds on a CPU) the reader gets the previous window's snapshot,
    whose own `time` says how old it is. Only the very first snapshot is waited for."""

    def __init__(
        self,
        take,
        period_s: float,
        *,
        cost_factor: float = 4.0,
        clock=time.monotonic,
        max_wait_s: float = 0.2,
    ):
        self._take, self.period_s, self.cost_factor, self._clock = (
            take,
            period_s,
            cost_factor,
            clock,
        )
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._period: _Period | None = None
        self._pending: Future | None = None  # the take in flight, if any
        self.takes = 0  # how many snapshots were taken (tests, metrics)
        self.stale_reads = 0  # reads answered with the previous window (engine busy)

    def current(self) -> _Period:
        """This window's snapshot; when it is older than its window_s(), a new one is taken (off
        the reader's thread) and waited for at most max_wait_s."""
        with self._lock:
            now = self._clock()
            p = self._period
            if p is not None and now - p.taken < self.window_s(p):
                return p
            pending = self._pending
            if pending is None:
                pending = self._pending = Future()
                threading.Thread(
                    target=self._take_into,
                    args=(pending, now),
                    daemon=True,
                    name="kv-snapshot-take",
                ).start()
        if p is None:
            return pending.result()  # nothing older to show: the first one is waited for
        try:
            return pending.result(timeout=self.max_wait_s)
        except FutureTimeout:
            self.stale_reads += 1
            return p

    def _take_into(self, fut: Future, asked: float) -> None:
        try:
            snap = self._take()
        except BaseException as e:  # e.g. RuntimeError: the engine was shut down
            with self._lock:
                self._pending = None
            fut.set_exception(e)
            return
        # the take's cost is not counted: it is mostly waiting for a step boundary
        p = _Period(snap, asked, 0.0)
        with self._lock:
            self._period, self._pending = p, None
            self.takes += 1
        fut.set_result(p)

    def window_s(self, p: _Period | None = None) -> float:
        """How long a snapshot is shared: period_s, or cost_factor x its build cost if longer."""
        p = p or self._period
        return max(self.period_s, self.cost_factor * p.cost) if p is not None else self.period_s

    def _form(self, p: _Period, key: str, build):
        with p.locks[key]:
            if key not in p.forms:
                t0 = self._clock()
                p.forms[key] = build()
                p.cost += self._clock() - t0
            return p.forms[key]

    def json(self, compact: bool = False) -> dict:
        """The period's /api/kv dict (full, or compact: engine/observe/kv_contract.KVSnapshot.to_json).
        Shared by all callers: read-only."""
        p = self.current()
        return self._form(
            p, "dict-compact" if compact else "dict", lambda: p.snap.to_json(compact=compact)
        )

    def body(self, compact: bool = False) -> bytes:
        """The period's /api/kv JSON bytes, serialized once for all viewers."""
        p = self.current()
        d = self._form(
            p, "dict-compact" if compact else "dict", lambda: p.snap.to_json(compact=compact)
        )
        return self._form(p, "bytes-compact" if compact else "bytes", lambda: json_bytes(d))
