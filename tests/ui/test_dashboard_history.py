"""Hit-rate windows, throughput and the timeline frames, from hand-made samples."""
import pytest

from ui.dashboard.history import (SERIES_BLOCKS, SERIES_HIT, History, Sample, blocks_frame, hit_rate_frame,
                                  sample_of, window_hit_rate, window_throughput)
from tests.ui.snapshots import make_snapshot


def s(t, q, h, gen=0, used=0, unshared=0, contiguous=0, total=100):
    return Sample(t, q, h, gen, used, unshared, contiguous, total)


# queries/hits every 10 s: the first 60 s are all hits, the last 30 s all misses
SAMPLES = [s(0, 0, 0), s(10, 100, 100), s(30, 300, 300), s(60, 600, 600), s(70, 700, 600),
           s(90, 900, 600)]


def test_hit_rate_windows():
    # last 60 s: base = newest sample at or before t=30 -> (300, 300): 600 queries, 300 hits
    assert window_hit_rate(SAMPLES, 60) == pytest.approx(0.5)
    # last 20 s: base = t=70: 200 queries, 0 hits
    assert window_hit_rate(SAMPLES, 20) == 0.0
    # a window longer than the history: everything since the first sample
    assert window_hit_rate(SAMPLES, 1000) == pytest.approx(600 / 900)
    assert window_hit_rate(SAMPLES[:1], 60) is None               # one sample: no interval
    assert window_hit_rate([s(0, 5, 5), s(9, 5, 5)], 60) is None  # no queries in the window
    assert window_hit_rate([], 60) is None


def test_throughput_from_generated_token_deltas():
    samples = [s(0, 0, 0, gen=0), s(2, 0, 0, gen=40), s(4, 0, 0, gen=100), s(6, 0, 0, gen=130)]
    assert window_throughput(samples, 5) == pytest.approx(130 / 6)         # newest at or before t=1: t=0
    assert window_throughput(samples, 2) == pytest.approx(15.0)            # t=4 -> t=6
    assert window_throughput(samples[:1], 5) is None


def test_history_records_each_snapshot_once_and_trims_the_horizon():
    h = History(horizon_s=30)
    snap = make_snapshot(8, 16, [{"key": "a", "state": "running", "num_computed": 20, "table": [0, 1]}],
                         queries=10, hits=5, generated=3, t=100.0, max_model_len=64)
    assert h.add(snap) and not h.add(snap)                 # same time: one sample for N viewers
    assert sample_of(snap) == Sample(100.0, 10, 5, 3, 2, 2, 4, 8)
    for t in (110.0, 120.0, 140.0):
        h.add(dict(snap, time=t))
    assert [x.t for x in h.snapshot()] == [110.0, 120.0, 140.0]
    h.add(dict(snap, time=150.0, stats=dict(snap["stats"], generated_tokens_total=0)))
    assert [x.t for x in h.snapshot()] == [150.0]          # counters went back: a new engine


def test_blocks_frame_long_format_seconds_ago():
    samples = [s(0, 0, 0, used=1, unshared=2, contiguous=8), s(400, 0, 0, used=3, unshared=5, contiguous=16),
               s(500, 0, 0, used=4, unshared=6, contiguous=16)]
    df = blocks_frame(samples)                                  # last 300 s only
    assert list(df.columns) == ["seconds", "series", "blocks"]
    assert sorted(set(df["seconds"])) == [-100.0, 0.0]
    now = df[df["seconds"] == 0.0].set_index("series")["blocks"].to_dict()
    assert now == {SERIES_BLOCKS[0]: 4, SERIES_BLOCKS[1]: 6, SERIES_BLOCKS[2]: 16, SERIES_BLOCKS[3]: 100}
    two = blocks_frame(samples, series=SERIES_BLOCKS[:2])
    assert set(two["series"]) == set(SERIES_BLOCKS[:2]) and len(two) == 4


def test_hit_rate_frame_cumulative_and_recent():
    df = hit_rate_frame(SAMPLES)
    cum = df[df["series"] == "since start"].set_index("seconds")["hit rate %"].to_dict()
    assert cum[0.0] == 66.67 and cum[-80.0] == 100.0
    recent = df[df["series"] == "last 10 s"].set_index("seconds")["hit rate %"].to_dict()
    assert recent[0.0] == 0.0                                   # t=90 vs t=70: all misses
    assert recent[-30.0] == 100.0                               # t=60 vs t=30


def test_frames_name_every_series_even_without_points():
    # Gradio's LinePlot fixes the colour domain on its first value: every series must be in it
    for df, names in ((blocks_frame([]), SERIES_BLOCKS), (hit_rate_frame([]), SERIES_HIT)):
        assert list(df["series"]) == list(names) and df["seconds"].isna().all()
        assert df["series"].dtype == object and df["seconds"].dtype == "float64"
    early = hit_rate_frame([s(0, 10, 5), s(20, 10, 5)])         # no query in the last 10 s
    assert set(early["series"]) == set(SERIES_HIT)
    assert early[early["series"] == "last 10 s"]["hit rate %"].isna().all()
