"""A short history of snapshot counters: hit-rate windows, throughput and the timeline plots.

One History per engine, fed once per new snapshot (not per viewer). Samples are plain tuples so
the window arithmetic is testable with hand-made numbers.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import NamedTuple

import pandas as pd

from ui.dashboard.kv_math import blocks_for

HORIZON_S = 600.0          # keep ten minutes
PLOT_WINDOW_S = 300.0      # plot the last five


class Sample(NamedTuple):
    t: float
    queries: int
    hits: int
    generated: int
    used: int              # physical blocks held
    unshared: int          # logical blocks: what paging without sharing would hold
    contiguous: int        # live sequences x ceil(max_model_len / block_size)
    total: int             # pool size in blocks


def sample_of(snap: dict) -> Sample:
    st = snap["stats"]
    live = st["num_sequences"] + st["num_idle_sessions"]
    return Sample(float(snap["time"]), st["prefix_cache_queries"], st["prefix_cache_hits"],
                  st.get("generated_tokens_total", 0), st["used_blocks"], st["logical_blocks"],
                  live * blocks_for(st.get("max_model_len", 0), st["block_size"]), st["total_blocks"])


def _base(samples, window_s: float, now: float):
    """The sample to difference against: the newest one at least window_s old, else the oldest."""
    start = now - window_s
    base = None
    for s in samples:
        if s.t <= start:
            base = s
        else:
            break
    return base if base is not None else (samples[0] if samples else None)


def window_hit_rate(samples, window_s: float, now: float | None = None) -> float | None:
    """Hits / queries over the last window_s seconds (None when no query happened in it)."""
    if not samples:
        return None
    last = samples[-1]
    base = _base(samples, window_s, last.t if now is None else now)
    dq = last.queries - base.queries
    if base is last or dq <= 0:
        return None
    return (last.hits - base.hits) / dq


def window_throughput(samples, window_s: float = 5.0, now: float | None = None) -> float | None:
    """Generated tokens per second over about the last window_s seconds."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    base = _base(samples, window_s, last.t if now is None else now)
    dt = last.t - base.t
    return (last.generated - base.generated) / dt if dt > 0 else None


class History:
    def __init__(self, horizon_s: float = HORIZON_S):
        self.horizon_s = horizon_s
        self.samples: deque[Sample] = deque()
        self._lock = threading.Lock()

    def add(self, snap: dict) -> bool:
        """Record a snapshot once (by its time); False if it is not newer than the last one."""
        s = sample_of(snap)
        with self._lock:
            if self.samples and s.t <= self.samples[-1].t:
                return False
            if self.samples and s.generated < self.samples[-1].generated:   # engine restarted
                self.samples.clear()
            self.samples.append(s)
            while self.samples and self.samples[0].t < s.t - self.horizon_s:
                self.samples.popleft()
        return True

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def hit_rate(self, window_s: float = 60.0) -> float | None:
        return window_hit_rate(self.snapshot(), window_s)

    def throughput(self, window_s: float = 5.0) -> float | None:
        return window_throughput(self.snapshot(), window_s)


SERIES_BLOCKS = ("used (paged + shared)", "paged, no sharing", "contiguous max-len", "pool size")
SERIES_COLORS = ("#f97316", "#60a5fa", "#9ca3af", "#111827")
SERIES_HIT = ("since start", "last 10 s")


def _frame(t, s, v, ycol: str, names) -> pd.DataFrame:
    """Typed, and every series named even before it has a point: Gradio's LinePlot fixes its colour
    domain when it first builds the chart, so a series missing then is never drawn. A missing
    series gets one empty (NaN) row, which Vega skips."""
    t, s, v = list(t), list(s), list(v)
    for name in names:
        if name not in s:
            t.append(float("nan"))
            s.append(name)
            v.append(float("nan"))
    return pd.DataFrame({"seconds": pd.Series(t, dtype="float64"), "series": pd.Series(s, dtype="object"),
                         ycol: pd.Series(v, dtype="float64")})


def blocks_frame(samples, window_s: float = PLOT_WINDOW_S, series=SERIES_BLOCKS) -> pd.DataFrame:
    """Long format (seconds ago, series, blocks) for gr.LinePlot(color='series')."""
    if not samples:
        return _frame([], [], [], "blocks", series)
    now = samples[-1].t
    keep = [s for s in samples if s.t >= now - window_s]
    rows_t, rows_s, rows_v = [], [], []
    for s in keep:
        for name, v in zip(SERIES_BLOCKS, (s.used, s.unshared, s.contiguous, s.total)):
            if name in series:
                rows_t.append(round(s.t - now, 2))
                rows_s.append(name)
                rows_v.append(v)
    return _frame(rows_t, rows_s, rows_v, "blocks", series)


def hit_rate_frame(samples, window_s: float = PLOT_WINDOW_S, recent_s: float = 10.0) -> pd.DataFrame:
    """Prefix-cache hit rate (%) over time: cumulative and over a sliding recent window."""
    if not samples:
        return _frame([], [], [], "hit rate %", SERIES_HIT)
    now = samples[-1].t
    rows_t, rows_s, rows_v = [], [], []
    j = 0                       # base of the recent window: newest sample at least recent_s older
    for i, s in enumerate(samples):
        while j + 1 < i and samples[j + 1].t <= s.t - recent_s:
            j += 1
        if s.t < now - window_s:
            continue
        x = round(s.t - now, 2)
        if s.queries:
            rows_t.append(x)
            rows_s.append(SERIES_HIT[0])
            rows_v.append(round(100 * s.hits / s.queries, 2))
        base = samples[j]
        if j < i and s.queries > base.queries:
            rows_t.append(x)
            rows_s.append(SERIES_HIT[1])
            rows_v.append(round(100 * (s.hits - base.hits) / (s.queries - base.queries), 2))
    return _frame(rows_t, rows_s, rows_v, "hit rate %", SERIES_HIT)
