"""What the Memory tab knows about a remote backend: a history of its /metrics samples and, when
the backend is another app.py, its latest KV snapshot (GET /api/kv).

Why here and not in the UI: the polling, the counter-to-rate arithmetic and the list of what the
backend does *not* expose are facts about the backend; the UI only draws them. One monitor per
engine polls at most once per `min_interval_s`, however many tabs watch the dashboard.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from backends.prometheus import Sample, parse, sample

WINDOW_S = 300.0

LABELS = {
    "kv_usage": "KV-cache usage",
    "prefix_queries": "prefix-cache queries",
    "prefix_hits": "prefix-cache hits",
    "running": "running requests",
    "waiting": "waiting requests",
    "preemptions": "preemptions",
    "prompt_tokens": "prompt-token counter",
    "generation_tokens": "generated-token counter",
}


def rate(a: float | None, b: float | None, dt: float) -> float | None:
    if a is None or b is None or dt <= 0:
        return None
    return max(0.0, b - a) / dt


class BackendMonitor:
    def __init__(self, engine, min_interval_s: float = 0.9):
        self.engine, self.min_interval_s = engine, min_interval_s
        self.samples: deque[tuple[float, Sample]] = deque()
        self.snapshot: dict | None = None
        self.kv_error: str | None = None
        self.metrics_available: bool | None = None
        self._polled = 0.0
        self._lock = threading.Lock()

    def poll(self) -> bool:
        """Fetch /metrics and /api/kv if the last poll is older than min_interval_s. True if polled."""
        with self._lock:
            now = time.time()
            if now - self._polled < self.min_interval_s:
                return False
            self._polled = now
            text = self.engine.metrics_text()
            self.metrics_available = text is not None
            if text is not None:
                self.samples.append((now, sample(parse(text))))
                while self.samples and now - self.samples[0][0] > WINDOW_S:
                    self.samples.popleft()
            try:
                self.snapshot, self.kv_error = self.engine.latest_snapshot(), None
            except RuntimeError as e:
                self.snapshot, self.kv_error = None, str(e)
            return True

    def latest(self) -> Sample | None:
        return self.samples[-1][1] if self.samples else None

    def rows(self) -> list[dict]:
        """One row per sample: seconds ago and the derived values (None where not exposed)."""
        pts = list(self.samples)
        if not pts:
            return []
        now, out = pts[-1][0], []
        for k, (t, s) in enumerate(pts):
            row = {
                "seconds": round(t - now, 1),
                "kv usage %": None if s.kv_usage is None else 100 * s.kv_usage,
                "running": s.running,
                "waiting": s.waiting,
                "preemptions": s.preemptions,
                "hit rate %": None,
                "generated tok/s": None,
                "prompt tok/s": None,
            }
            if k > 0:
                t0, s0 = pts[k - 1]
                q = rate(s0.prefix_queries, s.prefix_queries, 1.0)
                h = rate(s0.prefix_hits, s.prefix_hits, 1.0)
                if q:
                    row["hit rate %"] = 100 * min(1.0, (h or 0.0) / q)
                row["generated tok/s"] = rate(s0.generation_tokens, s.generation_tokens, t - t0)
                row["prompt tok/s"] = rate(s0.prompt_tokens, s.prompt_tokens, t - t0)
            if row["hit rate %"] is None and s.hit_rate_gauge is not None:
                row["hit rate %"] = 100 * s.hit_rate_gauge
            out.append(row)
        return out

    def cumulative_hit_rate(self) -> float | None:
        s = self.latest()
        if s is None:
            return None
        if s.prefix_queries:
            return (s.prefix_hits or 0.0) / s.prefix_queries
        return s.hit_rate_gauge

    def blind_spots(self) -> list[str]:
        """Plain sentences for what this dashboard cannot see on this backend."""
        out = []
        if self.metrics_available is False:
            out.append(
                "The backend serves no Prometheus /metrics (vLLM: on by default; SGLang: "
                "--enable-metrics; llama.cpp: --metrics), so there are no timelines."
            )
        else:
            s = self.latest()
            if s is not None:
                miss = [
                    LABELS[m]
                    for m in s.missing()
                    if not (m.startswith("prefix_") and s.hit_rate_gauge is not None)
                ]
                if s.engine is None:
                    out.append(
                        "/metrics has no vLLM, SGLang or llama.cpp metric names this page knows."
                    )
                elif miss:
                    out.append(f"{s.engine}'s /metrics does not export: {', '.join(miss)}.")
        if self.snapshot is None:
            out.append(
                "No block-level view: only another app.py exposes its block pool (GET /api/kv); "
                "which conversation holds which blocks, sharing and fragmentation are not visible "
                "from outside other engines."
            )
        out.append(
            "Sessions are not pinned remotely: each turn resends the whole conversation and the "
            "backend's prefix cache decides what is reused (the cached-token count per reply "
            "shows it when the backend reports it)."
        )
        return out
