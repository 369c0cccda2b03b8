"""One KV snapshot per period, shared by every reader, with each of its JSON forms built once.

Why: the dashboard ticks of many viewers, /api/kv and /metrics all want "the pool now", and at GPU
pool sizes the reader-side work is the expensive part (a 350k-block pool: ~0.3 s to build the
full v3-compatible dict, ~0.5 s more to serialize 13 MB). Taking the snapshot costs the engine
thread about a millisecond (engine/kv_contract.py), but building its forms holds the GIL, which
the engine thread needs too: so the work must not repeat per viewer. Here a period's snapshot is
taken once (on the first request in that period, never on a timer), and its forms (full or
compact dict, and their UTF-8 JSON bytes) are built on the first request for each, under a lock
of their own, then reused until the period ends. A compact reader never waits for a full build.
"""
from __future__ import annotations

import json
import threading
import time


def json_bytes(d: dict) -> bytes:
    """The JSON body as Starlette's JSONResponse would render it (compact separators, UTF-8)."""
    return json.dumps(d, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


class _Period:
    __slots__ = ("snap", "taken", "forms", "locks")

    def __init__(self, snap, taken: float):
        self.snap, self.taken = snap, taken
        self.forms: dict = {}
        self.locks = {key: threading.Lock() for key in ("dict", "dict-compact", "bytes", "bytes-compact")}


class SharedSnapshot:
    """`take()` returns a typed KVSnapshot (it runs on the engine thread; the caller waits)."""

    def __init__(self, take, period_s: float):
        self._take, self.period_s = take, period_s
        self._lock = threading.Lock()
        self._period: _Period | None = None
        self.takes = 0                     # how many snapshots were taken (tests, metrics)

    def current(self) -> _Period:
        """This period's snapshot, taken now if the last one is older than period_s."""
        with self._lock:
            now = time.time()
            p = self._period
            if p is None or now - p.taken >= self.period_s:
                p = self._period = _Period(self._take(), now)
                self.takes += 1
            return p

    def _form(self, p: _Period, key: str, build):
        with p.locks[key]:
            if key not in p.forms:
                p.forms[key] = build()
            return p.forms[key]

    def json(self, compact: bool = False) -> dict:
        """The period's /api/kv dict (full, or compact: engine/kv_contract.KVSnapshot.to_json).
        Shared by all callers: read-only."""
        p = self.current()
        return self._form(p, "dict-compact" if compact else "dict", lambda: p.snap.to_json(compact=compact))

    def body(self, compact: bool = False) -> bytes:
        """The period's /api/kv JSON bytes, serialized once for all viewers."""
        p = self.current()
        key = "bytes-compact" if compact else "bytes"
        return self._form(p, key, lambda: json_bytes(self._form(p, key.replace("bytes", "dict"),
                                                                lambda: p.snap.to_json(compact=compact))))
