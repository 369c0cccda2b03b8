"""The remote Memory view's pure parts (ui/dashboard/remote.py): headline wording and plot frames."""

from __future__ import annotations

from backends.monitor import BackendMonitor
from tests.backends.helpers import LLAMACPP, VLLM, _Backend
from ui.dashboard.remote import headline, long_frame


class _Engine(_Backend):
    model, root = "m", "http://gpu:8000"


def test_headline_says_measuring_then_a_rate_and_not_exposed_for_missing_counters():
    later = VLLM.replace("500.0", "700.0")
    eng = _Engine([VLLM, later])
    mon = BackendMonitor(eng, min_interval_s=0.0)
    mon.poll()
    html = headline(mon, eng)
    assert "vLLM" in html and "measuring…" in html and "75.0 %" in html and "3 / 1" in html
    mon.poll()
    assert "measuring…" not in headline(mon, eng)

    eng = _Engine([LLAMACPP])
    mon = BackendMonitor(eng, min_interval_s=0.0)
    mon.poll()
    html = headline(mon, eng)
    assert 'data-k="hit_rate"' in html and "not exposed" in html and "llama.cpp" in html


def test_long_frame_leaves_out_values_not_exposed():
    rows = [
        {"seconds": -1.0, "running": 2, "waiting": None},
        {"seconds": 0.0, "running": 3, "waiting": 1},
    ]
    df = long_frame(rows, "requests", {"running": "running", "waiting": "waiting"})
    assert list(df["series"]) == ["running", "running", "waiting"] and list(df["requests"]) == [
        2,
        3,
        1,
    ]
