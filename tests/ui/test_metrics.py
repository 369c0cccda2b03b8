"""GET /metrics (Prometheus text, parsed back strictly) and GET /api/kv on a routes-only FastAPI app."""

import json
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.ui.fake_engine import FakeLLM
from ui.dashboard import view as V
from tests.ui.snapshots import BPT, hand_snapshot
from routes.metrics import model_name_of, prometheus_text, register_routes
from tests.ui.helpers import parse


def test_prometheus_text_vllm_names_and_own_gauges():
    p = parse(prometheus_text(hand_snapshot(), 'Smol "LM"'))
    v = {k: x[0] for k, x in p["values"].items()}
    assert p["values"]["vllm:kv_cache_usage_perc"][1] == '{model_name="Smol \\"LM\\""}'
    assert v["vllm:kv_cache_usage_perc"] == pytest.approx(5 / 12)
    assert 0 <= v["vllm:kv_cache_usage_perc"] <= 1
    assert v["vllm:prefix_cache_queries_total"] == 40 and v["vllm:prefix_cache_hits_total"] == 30
    assert v["vllm:num_preemptions_total"] == 1
    assert v["vllm:num_requests_running"] == 2 and v["vllm:num_requests_waiting"] == 1
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
    ):
        assert p["meta"][name]["type"] == "counter"
    assert p["meta"]["vllm:num_requests_running"]["type"] == "gauge"
    own = {k[len("paged_chat_") :]: x for k, x in v.items() if k.startswith("paged_chat_")}
    assert (
        own["kv_blocks_total"] == 12 and own["kv_blocks_used"] == 5 and own["kv_blocks_free"] == 7
    )
    assert (
        own["kv_blocks_cached"] == 2
        and own["kv_blocks_shared"] == 2
        and own["kv_blocks_logical"] == 7
    )
    assert (
        own["kv_blocks_saved_by_sharing"] == 2 and own["kv_bytes_saved_by_sharing"] == 2 * 4 * BPT
    )
    assert (
        own["kv_capacity_tokens"] == 48
        and own["kv_used_tokens"] == 15
        and own["kv_free_tokens"] == 28
    )
    assert own["kv_bytes_per_token"] == BPT and own["kv_bytes_per_block"] == 4 * BPT
    assert own["kv_bytes_total"] == 12 * 4 * BPT and own["kv_bytes_used"] == 5 * 4 * BPT
    assert own["kv_savings_vs_unshared_ratio"] == pytest.approx(2 / 7)
    assert own["kv_savings_vs_contiguous_ratio"] == pytest.approx(19 / 24)
    assert own["kv_internal_fragmentation_tokens"] == 5
    assert own["sessions_idle"] == 1 and own["sequences_running"] == 2


def test_no_label_without_a_model_name():
    p = parse(prometheus_text(hand_snapshot()))
    assert p["values"]["vllm:num_requests_running"][1] == ""


def test_routes_on_a_bare_fastapi_app():
    llm = FakeLLM(snapshot=hand_snapshot())
    app = FastAPI()
    register_routes(app, llm)
    client = TestClient(app)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    assert 'vllm:num_requests_waiting{model_name="SmolLM2-135M-Instruct.Q4_1"} 1' in r.text
    parse(r.text)
    r = client.get("/api/kv")
    assert r.status_code == 200
    snap = r.json()
    assert snap["stats"]["used_blocks"] == 5 and set(snap["owners"]) == {"0", "1", "2", "3", "4"}
    assert V.consistency_problems(snap) == []
    assert llm.calls == ["latest", "latest"]
    client.get("/api/kv?fresh=1")
    assert llm.calls[-1] == "exact"
    json.dumps(snap)


def test_model_name_of():
    from engine.exec.model_info import model_name

    assert (
        model_name("/a/b/Model-1B/") == "Model-1B"
        and model_name("/m/SmolLM2.Q4_1.gguf") == "SmolLM2.Q4_1"
    )
    assert (
        model_name_of(FakeLLM()) == "SmolLM2-135M-Instruct.Q4_1"
    )  # a ChatEngine: its model's name
    assert (
        model_name_of(SimpleNamespace(model_info=lambda: SimpleNamespace(name="Model-1B"))) == ""
    )  # not one
