"""Hit-rate windows, throughput, the timeline frames (buckets, gaps) from hand-made samples, and the
stats sampler that feeds them with no page open."""

import pytest

from ui.dashboard.history import (
    SERIES_BLOCKS,
    SERIES_HIT,
    History,
    Sample,
    blocks_frame,
    hit_rate_frame,
    plot_points,
    sample_of,
    window_hit_rate,
    window_throughput,
)
from ui.dashboard.sampler import StatsSampler
from tests.e2e.polling import wait_until
from tests.ui.snapshots import make_snapshot


def s(t, q, h, gen=0, used=0, unshared=0, contiguous=0, total=100):
    return Sample(t, q, h, gen, used, unshared, contiguous, total)


# queries/hits every 10 s: the first 60 s are all hits, the last 30 s all misses
SAMPLES = [
    s(0, 0, 0),
    s(10, 100, 100),
    s(30, 300, 300),
    s(60, 600, 600),
    s(70, 700, 600),
    s(90, 900, 600),
]


def test_hit_rate_windows():
    # last 60 s: base = newest sample at or before t=30 -> (300, 300): 600 queries, 300 hits
    assert window_hit_rate(SAMPLES, 60) == pytest.approx(0.5)
    # last 20 s: base = t=70: 200 queries, 0 hits
    assert window_hit_rate(SAMPLES, 20) == 0.0
    # a window longer than the history: everything since the first sample
    assert window_hit_rate(SAMPLES, 1000) == pytest.approx(600 / 900)
    assert window_hit_rate(SAMPLES[:1], 60) is None  # one sample: no interval
    assert window_hit_rate([s(0, 5, 5), s(9, 5, 5)], 60) is None  # no queries in the window
    assert window_hit_rate([], 60) is None


def test_throughput_from_generated_token_deltas():
    samples = [s(0, 0, 0, gen=0), s(2, 0, 0, gen=40), s(4, 0, 0, gen=100), s(6, 0, 0, gen=130)]
    assert window_throughput(samples, 5) == pytest.approx(130 / 6)  # newest at or before t=1: t=0
    assert window_throughput(samples, 2) == pytest.approx(15.0)  # t=4 -> t=6
    assert window_throughput(samples[:1], 5) is None


def test_history_records_each_snapshot_once_and_trims_the_horizon():
    h = History(horizon_s=30)
    snap = make_snapshot(
        8,
        16,
        [{"key": "a", "state": "running", "num_computed": 20, "table": [0, 1]}],
        queries=10,
        hits=5,
        generated=3,
        t=100.0,
        max_model_len=64,
    )
    assert h.add(snap) and not h.add(snap)  # same time: one sample for N viewers
    assert sample_of(snap) == Sample(100.0, 10, 5, 3, 2, 2, 4, 8)
    for t in (110.0, 120.0, 140.0):
        h.add(dict(snap, time=t))
    assert [x.t for x in h.snapshot()] == [110.0, 120.0, 140.0]
    h.add(dict(snap, time=150.0, stats=dict(snap["stats"], generated_tokens_total=0)))
    assert [x.t for x in h.snapshot()] == [150.0]  # counters went back: a new engine


def test_blocks_frame_long_format_seconds_ago():
    samples = [
        s(0, 0, 0, used=1, unshared=2, contiguous=8),
        s(400, 0, 0, used=3, unshared=5, contiguous=16),
        s(500, 0, 0, used=4, unshared=6, contiguous=16),
    ]
    df = blocks_frame(samples, step_s=None)  # every sample, last 300 s only
    assert list(df.columns) == ["seconds", "series", "blocks"]
    assert sorted(set(df.dropna()["seconds"])) == [-100.0, 0.0]
    assert df[df["seconds"] == -50.0]["blocks"].isna().all()  # 100 s without a sample: a gap
    now = df[df["seconds"] == 0.0].set_index("series")["blocks"].to_dict()
    assert now == {
        SERIES_BLOCKS[0]: 4,
        SERIES_BLOCKS[1]: 6,
        SERIES_BLOCKS[2]: 16,
        SERIES_BLOCKS[3]: 100,
    }
    two = blocks_frame(samples, series=SERIES_BLOCKS[:2], step_s=None)
    assert set(two["series"]) == set(SERIES_BLOCKS[:2]) and len(two) == 6


def test_hit_rate_frame_cumulative_and_recent():
    df = hit_rate_frame(SAMPLES, step_s=None)
    cum = df[df["series"] == "since start"].set_index("seconds")["hit rate %"].to_dict()
    assert cum[0.0] == 66.67 and cum[-80.0] == 100.0
    recent = df[df["series"] == "last 10 s"].set_index("seconds")["hit rate %"].to_dict()
    assert recent[0.0] == 0.0  # t=90 vs t=70: all misses
    assert recent[-30.0] == 100.0  # t=60 vs t=30


def test_frames_name_every_series_even_without_points():
    # Gradio's LinePlot fixes the colour domain on its first value: every series must be in it
    for df, names in ((blocks_frame([]), SERIES_BLOCKS), (hit_rate_frame([]), SERIES_HIT)):
        assert list(df["series"]) == list(names) and df["seconds"].isna().all()
        assert df["series"].dtype == object and df["seconds"].dtype == "float64"
    early = hit_rate_frame([s(0, 10, 5), s(20, 10, 5)])  # no query in the last 10 s
    assert set(early["series"]) == set(SERIES_HIT)
    assert early[early["series"] == "last 10 s"]["hit rate %"].isna().all()


def test_plot_points_every_second_have_no_gap_but_a_stall_does():
    dense = [s(t, 0, 0) for t in range(100, 120)]
    assert [i for _, i in plot_points(dense, step_s=None)] == list(range(20))
    stalled = dense[:10] + [s(t, 0, 0) for t in range(113, 120)]  # 110..112 not recorded
    pts = plot_points(stalled, step_s=None)
    gaps = [x for x, i in pts if i is None]
    assert gaps == [-8.0]  # between t=109 and t=113
    # 2 s apart is still one interval of jitter, not a gap
    assert all(
        i is not None for _, i in plot_points([s(0, 0, 0), s(2, 0, 0), s(4, 0, 0)], step_s=None)
    )


def test_buckets_change_only_when_a_bucket_completes_and_empty_buckets_are_gaps():
    every_second = [s(t, 0, 0, used=t) for t in range(100, 131)]  # 100..130
    df = blocks_frame(every_second, series=SERIES_BLOCKS[:1], step_s=5)
    # buckets [100,105) ... [125,130) are complete; [130,135) is filling and not plotted
    assert df["seconds"].tolist() == [-25.0, -20.0, -15.0, -10.0, -5.0, 0.0]
    assert df["blocks"].tolist() == [104, 109, 114, 119, 124, 129]  # each bucket's last sample
    for more in range(131, 135):  # the next 4 s: same frame
        later = blocks_frame(
            every_second + [s(t, 0, 0, used=t) for t in range(131, more + 1)],
            series=SERIES_BLOCKS[:1],
            step_s=5,
        )
        assert later.equals(df)
    # the app was down from t=112 to t=124: [110,115) has data, [115,120) and [120,125) none:
    # one NaN row between the points around the outage, no line across it
    down = [x for x in every_second if not 112 <= x.t <= 124]
    got = blocks_frame(down, series=SERIES_BLOCKS[:1], step_s=5)
    assert got["seconds"].tolist() == [-25.0, -20.0, -15.0, -5.0, 0.0]
    assert got["blocks"].isna().tolist() == [False, False, False, True, False]
    hit = hit_rate_frame(
        [x._replace(queries=10 * i + 10, hits=5 * i) for i, x in enumerate(down)], step_s=5
    )
    assert (
        hit[hit["seconds"] == -5.0]["hit rate %"].isna().all()
        and len(hit[hit["seconds"] == -5.0]) == 2
    )


class StatsLLM:
    """An engine that only has the stats contract; raises once 'shut down', like LLM."""

    def __init__(self, snap):
        self.stats_json, self.reads, self.down = snap["stats"], 0, False

    def stats(self):
        if self.down:
            raise RuntimeError("the engine has been shut down")
        self.reads += 1
        return dict(self.stats_json, generated_tokens_total=self.reads)


def test_sampler_records_without_any_page_and_stops_with_the_engine():
    snap = make_snapshot(
        8,
        16,
        [{"key": "a", "state": "running", "num_computed": 20, "table": [0, 1]}],
        max_model_len=64,
    )
    llm, h = StatsLLM(snap), History()
    clock = iter(float(t) for t in range(1000, 2000))
    sampler = StatsSampler(llm, h, clock=lambda: next(clock))
    assert sampler.sample_once() and sampler.sample_once()
    assert [x.t for x in h.snapshot()] == [1000.0, 1001.0] and h.snapshot()[0].used == 2
    llm.down = True
    assert not sampler.sample_once() and sampler._stop.is_set()
    live = StatsSampler(StatsLLM(snap), History(), interval_s=0.05).start()
    wait_until(lambda: live.samples >= 3, 10, what="three samples from the thread")
    live.stop()
    assert not live.running


def test_flat_stretches_cost_two_rows_and_gaps_keep_their_neighbours():
    flat = [s(t, 0, 0, used=7) for t in range(0, 301)]  # an idle engine, 5 minutes
    df = blocks_frame(flat, series=SERIES_BLOCKS[:1], step_s=5)
    assert df["blocks"].tolist() == [7, 7] and df["seconds"].tolist() == [-295.0, 0.0]
    holed = [x for x in flat if not 100 <= x.t < 110]
    got = blocks_frame(holed, series=SERIES_BLOCKS[:1], step_s=5)
    assert got["blocks"].isna().sum() == 1 and len(got) == 5  # 7 .. 7, gap, 7 .. 7
    # phases shift the bucket edges, so plots with different phases change on different ticks
    a = [blocks_frame(flat[:n], series=SERIES_BLOCKS[:1]).to_csv() for n in range(250, 260)]
    b = [
        blocks_frame(flat[:n], series=SERIES_BLOCKS[:1], phase_s=2.0).to_csv()
        for n in range(250, 260)
    ]
    changed_a = {n for n in range(1, 10) if a[n] != a[n - 1]}
    changed_b = {n for n in range(1, 10) if b[n] != b[n - 1]}
    assert changed_a and changed_b and not changed_a & changed_b


def test_y_limits_leave_headroom_above_the_highest_point():
    import pandas as pd
    from ui.dashboard.history import HEADROOM, y_limits

    def lim(values):
        return y_limits(pd.DataFrame({"blocks": pd.Series(values, dtype="float64")}), "blocks")

    for values in ([1024.0], [4096.0, 3000.0], [530.0, float("nan")], [99.0], [7.0]):
        low, top = lim(values)
        assert low == 0 and top >= max(v for v in values if v == v) * (1 + HEADROOM)
        assert top == float(f"{top:.2g}")  # two significant digits: stable
    assert lim([]) == [0.0, 10.0] and lim([0.0]) == [0.0, 10.0]
    assert lim([1024.0]) == lim([1050.0])  # unchanged while the data stays under it
