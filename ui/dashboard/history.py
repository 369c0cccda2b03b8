"""A short history of engine counters: hit-rate windows, throughput and the timeline plots.

One History per engine, fed by ui/dashboard/sampler.py once a second whether or not a page is
open (stats only, not the snapshot), so the charts are continuous; without a sampler (tests, a
bare DashboardState) each new snapshot a tick reads is recorded instead. Samples are plain tuples
so the window arithmetic is testable with hand-made numbers.

Plots are drawn from PLOT_STEP_S buckets (the last sample of each), complete buckets only: a plot's
data then changes once per bucket, not every tick, so a tick usually sends no plot at all (the
tick skips unchanged outputs). A bucket with no sample while its neighbours have some is a period
when nothing was recorded (app stopped, engine stalled, restart): it becomes a row of NaN, which
the chart draws as a gap rather than a straight line across it.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import NamedTuple

import pandas as pd

from ui.dashboard.kv_math import blocks_for

HORIZON_S = 600.0  # keep ten minutes
PLOT_WINDOW_S = 300.0  # plot the last five
PLOT_STEP_S = 10.0  # one plotted point per 10 s bucket; 3 plots at phases 3.3 s apart: <= 1 per slow (2 s) tick


class Sample(NamedTuple):
    t: float
    queries: int
    hits: int
    generated: int
    used: int  # physical blocks held
    unshared: int  # logical blocks: what paging without sharing would hold
    contiguous: int  # live sequences x ceil(max_model_len / block_size)
    total: int  # pool size in blocks


def sample_of(snap: dict) -> Sample:
    return sample_of_stats(snap["stats"], snap["time"])


def sample_of_stats(st: dict, t: float) -> Sample:
    """A sample from the stats contract alone (what the sampler reads each second)."""
    live = st["num_sequences"] + st["num_idle_sessions"]
    return Sample(
        float(t),
        st["prefix_cache_queries"],
        st["prefix_cache_hits"],
        st.get("generated_tokens_total", 0),
        st["used_blocks"],
        st["logical_blocks"],
        live * blocks_for(st.get("max_model_len", 0), st["block_size"]),
        st["total_blocks"],
    )


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
        return self.add_sample(sample_of(snap))

    def add_sample(self, s: Sample) -> bool:
        with self._lock:
            if self.samples and s.t <= self.samples[-1].t:
                return False
            if self.samples and s.generated < self.samples[-1].generated:  # engine restarted
                self.samples.clear()
            self.samples.append(s)
            while self.samples and self.samples[0].t < s.t - self.horizon_s:
                self.samples.popleft()
        return True

    def clear(self) -> None:
        """Forget every sample (another model's pool now: its lines do not continue these)."""
        with self._lock:
            self.samples.clear()

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


def _drop_flat(t, s, v):
    """Drop a point whose series has the same value just before and just after it: the line
    looks the same, and an idle engine's flat minutes (or the constant pool size) cost two rows."""
    keep = [True] * len(t)
    last: dict = {}  # series -> indices of its last two rows
    for i, name in enumerate(s):
        a, b = last.get(name, (None, None))
        if a is not None and b is not None and v[a] == v[b] == v[i]:  # NaN never equals
            keep[b] = False
            last[name] = (a, i)
        else:
            last[name] = (b, i)
    return (
        [x for x, k in zip(t, keep) if k],
        [x for x, k in zip(s, keep) if k],
        [x for x, k in zip(v, keep) if k],
    )


def _frame(t, s, v, ycol: str, names) -> pd.DataFrame:
    """Typed, and every series named even before it has a point: Gradio's LinePlot fixes its colour
    domain when it first builds the chart, so a series missing then is never drawn. A missing
    series gets one empty (NaN) row, which Vega skips."""
    t, s, v = _drop_flat(list(t), list(s), list(v))
    for name in names:
        if name not in s:
            t.append(float("nan"))
            s.append(name)
            v.append(float("nan"))
    return pd.DataFrame(
        {
            "seconds": pd.Series(t, dtype="float64"),
            "series": pd.Series(s, dtype="object"),
            ycol: pd.Series(v, dtype="float64"),
        }
    )


def plot_points(
    samples,
    window_s: float = PLOT_WINDOW_S,
    step_s: float | None = PLOT_STEP_S,
    gap_s: float = 2.0,
    phase_s: float = 0.0,
) -> list[tuple[float, int | None]]:
    """(x = seconds ago, index of the sample plotted there or None for a gap), oldest first.

    step_s: one point per complete bucket (its last sample), x counted from the newest complete
    bucket, so the points change only when a bucket completes; a bucket with no sample between
    two that have one is a gap. phase_s shifts the bucket edges (each plot its own phase, so the
    three plots do not all change, and all get sent, in the same tick). step_s None: every sample, a gap where two samples are more than
    gap_s apart (x from the newest sample)."""
    if not samples:
        return []
    pts: list[tuple[float, int | None]] = []
    if step_s is None:
        now = samples[-1].t
        prev = None
        for i, s in enumerate(samples):
            if s.t < now - window_s:
                continue
            if prev is not None and s.t - prev > gap_s:
                pts.append((round((prev + s.t) / 2 - now, 2), None))
            pts.append((round(s.t - now, 2), i))
            prev = s.t
        return pts
    current = int((samples[-1].t - phase_s) // step_s)  # the bucket still filling: not plotted yet
    last_of: dict[int, int] = {}
    for i, s in enumerate(samples):
        b = int((s.t - phase_s) // step_s)
        if b < current:
            last_of[b] = i
    first = current - int(window_s // step_s)
    keep = sorted(b for b in last_of if b >= first)
    for j, b in enumerate(keep):
        if j and b - keep[j - 1] > 1:
            pts.append((float((b - 1 - (current - 1)) * step_s), None))
        pts.append((float((b - (current - 1)) * step_s), last_of[b]))
    return pts


HEADROOM = 0.08  # above a plot's highest point, so its line is drawn inside the plot


def y_limits(frame: pd.DataFrame, column: str, floor: float = 10.0) -> list[float]:
    """[0, top] for a plot's y axis: top is the highest point plus HEADROOM, rounded up to two
    significant digits (at least `floor`).

    Why: Gradio's LinePlot gives Vega-Lite a y scale with `zero: false` and no `nice`, so the axis
    ends exactly at the data's highest point and that line lies on the plot's top edge, half of
    its stroke clipped away (the pool-size and contiguous lines sit there for minutes). Rounded, so
    the limit changes only when the data outgrows it rather than on every point."""
    values = (
        pd.to_numeric(frame[column], errors="coerce").dropna()
        if len(frame)
        else pd.Series([], dtype=float)
    )
    top = max(float(values.max()) if len(values) else 0.0, 0.0) * (1 + HEADROOM)
    top = max(top, floor)
    step = 10 ** (math.floor(math.log10(top)) - 1)  # two significant digits
    return [0.0, float(math.ceil(top / step - 1e-9) * step)]


def blocks_frame(
    samples,
    window_s: float = PLOT_WINDOW_S,
    series=SERIES_BLOCKS,
    step_s: float | None = PLOT_STEP_S,
    phase_s: float = 0.0,
) -> pd.DataFrame:
    """Long format (seconds ago, series, blocks) for gr.LinePlot(color='series'); NaN rows are gaps."""
    rows_t, rows_s, rows_v = [], [], []
    for x, i in plot_points(samples, window_s, step_s, phase_s=phase_s):
        s = samples[i] if i is not None else None
        for name, v in zip(
            SERIES_BLOCKS, (s.used, s.unshared, s.contiguous, s.total) if s else (None,) * 4
        ):
            if name in series:
                rows_t.append(x)
                rows_s.append(name)
                rows_v.append(float("nan") if v is None else v)
    return _frame(rows_t, rows_s, rows_v, "blocks", series)


def hit_rate_frame(
    samples,
    window_s: float = PLOT_WINDOW_S,
    recent_s: float = 10.0,
    step_s: float | None = PLOT_STEP_S,
    phase_s: float = 0.0,
) -> pd.DataFrame:
    """Prefix-cache hit rate (%) over time: cumulative and over a sliding recent window."""
    cum, recent = {}, {}
    j = 0  # base of the recent window: newest sample at least recent_s older
    for i, s in enumerate(samples):
        while j + 1 < i and samples[j + 1].t <= s.t - recent_s:
            j += 1
        if s.queries:
            cum[i] = round(100 * s.hits / s.queries, 2)
        base = samples[j]
        if j < i and s.queries > base.queries:
            recent[i] = round(100 * (s.hits - base.hits) / (s.queries - base.queries), 2)
    rows_t, rows_s, rows_v = [], [], []
    for x, i in plot_points(samples, window_s, step_s, phase_s=phase_s):
        for name, values in zip(SERIES_HIT, (cum, recent)):
            if i is None or i in values:
                rows_t.append(x)
                rows_s.append(name)
                rows_v.append(float("nan") if i is None else values[i])
    return _frame(rows_t, rows_s, rows_v, "hit rate %", SERIES_HIT)
