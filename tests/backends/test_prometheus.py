"""Reading vLLM, SGLang and llama.cpp /metrics text (formats as their docs show them) into one
Sample, and the monitor's rates and plain-words blind spots."""

from __future__ import annotations

import pytest

from backends.monitor import BackendMonitor
from backends.prometheus import parse, sample
from tests.backends.helpers import LLAMACPP, VLLM, _Backend

SGLANG = """# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
sglang:cache_hit_rate{model_name="m"} 0.0075
sglang:num_running_reqs{model_name="m"} 4.0
sglang:num_queue_reqs{model_name="m"} 0.0
sglang:prompt_tokens_total{model_name="m"} 8.128902e+06
sglang:generation_tokens_total{model_name="m"} 7.557572e+06
"""


def test_vllm_names_summed_over_labels_buckets_ignored():
    m = parse(VLLM)
    assert "vllm:time_to_first_token_seconds_bucket" not in m
    s = sample(m)
    assert s.engine == "vLLM" and s.kv_usage == pytest.approx(0.75)  # two engines' gauges summed
    assert (s.running, s.waiting, s.preemptions) == (3, 1, 2)
    assert (s.prefix_queries, s.prefix_hits, s.generation_tokens) == (1000, 600, 500)
    assert s.missing() == []


def test_sglang_and_llamacpp_equivalents_and_what_they_lack():
    s = sample(parse(SGLANG))
    assert (
        s.engine == "SGLang"
        and s.kv_usage == pytest.approx(0.28)
        and s.hit_rate_gauge == pytest.approx(0.0075)
    )
    assert (s.running, s.waiting) == (4, 0) and s.generation_tokens == pytest.approx(7.557572e6)
    assert "preemptions" in s.missing()
    s = sample(parse(LLAMACPP))
    assert s.engine == "llama.cpp" and s.kv_usage == 0.125 and (s.running, s.waiting) == (1, 0)
    assert {"prefix_hits", "prefix_queries", "preemptions"} <= set(s.missing())
    assert sample(parse("process_cpu_seconds_total 3.0\n")).engine is None


def test_monitor_rates_from_counters_and_blind_spots():
    later = VLLM.replace("1000.0", "1100.0").replace("600.0", "680.0").replace("500.0", "700.0")
    mon = BackendMonitor(_Backend([VLLM, later]), min_interval_s=0.0)
    assert mon.poll() and mon.poll()
    rows = mon.rows()
    assert rows[0]["hit rate %"] is None  # a rate needs two samples
    assert rows[1]["hit rate %"] == pytest.approx(80.0)  # 80 of the last 100 queried tokens
    assert rows[1]["kv usage %"] == pytest.approx(75.0) and rows[1]["generated tok/s"] > 0
    assert mon.cumulative_hit_rate() == pytest.approx(680 / 1100)
    blind = " ".join(mon.blind_spots())
    assert "No block-level view" in blind and "does not export" not in blind

    mon = BackendMonitor(_Backend([LLAMACPP]), min_interval_s=0.0)
    mon.poll()
    blind = " ".join(mon.blind_spots())
    assert (
        "llama.cpp's /metrics does not export: prefix-cache queries, prefix-cache hits, preemptions"
        in blind
    )

    mon = BackendMonitor(_Backend([]), min_interval_s=0.0)
    mon.poll()
    assert "serves no Prometheus /metrics" in " ".join(mon.blind_spots()) and mon.rows() == []
