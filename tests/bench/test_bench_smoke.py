"""`python -m bench --quick` runs end to end on a tiny workload and its JSON has every field.

No timing is asserted: the numbers of a quick run on a shared machine mean nothing. Only that the
command works, every system ran, and the report has the shape docs/BENCHMARKS.md describes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.metrics import ROW_FIELDS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--sessions",
            "2",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f), out, proc.stdout


def _row_ok(row: dict, name: str) -> None:
    assert "error" not in row, f"{name}: {row.get('error')}"
    for k in ROW_FIELDS:
        assert k in row, f"{name} lacks {k}"
    assert row["requests"] > 0 and row["output_tokens"] > 0, name
    assert row["peak_kv_bytes"] and row["peak_kv_bytes"] > 0, name


def test_top_level_and_machine(quick_run):
    res, out, stdout = quick_run
    for k in (
        "started",
        "command",
        "args",
        "quick",
        "sizes",
        "machine",
        "loadavg_start",
        "loadavg_end",
        "elapsed_s",
        "limits",
        "engine",
        "workloads",
        "targets",
        "notes",
    ):
        assert k in res, k
    assert res["quick"] is True
    for k in ("cpu_model", "cores", "torch", "torch_threads", "device", "transformers", "commit"):
        assert k in res["machine"], k
    assert len(res["loadavg_start"]) == 3 and len(res["loadavg_end"]) == 3
    lim = res["limits"]
    for k in (
        "gemm_flops",
        "read_bytes_per_s",
        "compute_bound_tok_s",
        "weight_bw_bound_tok_s",
        "num_params",
        "samples",
    ):
        assert k in lim, k
    assert lim["compute_bound_tok_s"] > 0 and lim["weight_bw_bound_tok_s"] > 0
    assert os.path.exists(os.path.splitext(out)[0] + ".md")
    assert "## Targets" in stdout and "## chat" in stdout


def test_chat_systems_and_sessions_fit(quick_run):
    chat = quick_run[0]["workloads"]["chat"]
    for name in ("engine", "hf_static_batch", "hf_sequential", "hf_generate_batch"):
        _row_ok(chat["systems"][name], name)
    e = chat["systems"]["engine"]
    assert e["output_tokens"] == sum(chat["output_lens"])  # EOS ignored: exact lengths
    assert e["prefill_tokens_cached"] > 0  # the shared system prompt hit
    for k in ("tokens_per_s_engine_over_hf_static", "peak_kv_engine_over_hf_static"):
        assert chat["ratios"][k] is not None
    assert set(chat["token_match_vs_engine"]) >= {
        "hf_static_batch",
        "hf_sequential",
        "hf_generate_batch",
    }
    fit = chat["sessions_fit"]
    assert len(fit["rows"]) == 5 and all(
        "sessions" in r and "workload_bytes" in r for r in fit["rows"]
    )
    assert fit["rows"][-1]["sessions"] >= fit["rows"][-2]["sessions"]  # sharing never fits fewer


def test_multiturn_fields(quick_run):
    mt = quick_run[0]["workloads"]["multiturn"]
    systems = {"engine_session", "engine_prefix_cache_only", "engine_no_reuse", "hf_generate"}
    assert mt["turns"] and all(set(t["ttft_s"]) == systems for t in mt["turns"])
    assert all(set(t["prefill_computed"]) == systems for t in mt["turns"])
    assert len(mt["per_turn"]) == mt["sizes"]["turns"]
    ns = mt["new_session_cached_system_prompt"]
    assert {"ttft_cached_p50_s", "ttft_cold_p50_s", "speedup", "samples"} <= set(ns)
    # the session reuses the previous turn: later turns compute fewer prompt tokens than no reuse
    later = [t for t in mt["turns"] if t["turn"] > 1]
    assert all(
        t["prefill_computed"]["engine_session"] < t["prefill_computed"]["engine_no_reuse"]
        for t in later
    )


def test_decode_and_targets(quick_run):
    res = quick_run[0]
    dec = res["workloads"]["decode"]
    assert list(dec["batches"]) == [str(b) for b in dec["sizes"]["batches"]]
    for b, r in dec["batches"].items():
        _row_ok(r["systems"]["engine"], f"engine B={b}")
        _row_ok(r["systems"]["hf_static_batch"], f"hf B={b}")
        assert "decode_ratio_engine_over_hf" in r and "token_match_vs_engine" in r
    names = [t["target"] for t in res["targets"]]
    assert len(names) >= 4  # B=32 target needs B=32 in the run; quick has 1 and 4
    assert all({"value", "threshold", "met"} <= set(t) for t in res["targets"])
