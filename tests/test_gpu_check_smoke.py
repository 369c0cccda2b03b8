"""scripts/gpu_check.sh / gpu_check.py on CPU: the check always leaves its JSON and says what ran.

The robustness tests use stages that need no model (preflight, kernels = a pytest child, attention)
and `--fault STAGE=raise|hang|sticky`, which replaces one stage's body; everything else (the report,
the signal watcher, the watchdog, the budget, the verdict) is the real code. The slow test runs every
stage in smoke mode (tiny shapes, interpreted Triton) so the script cannot rot between GPU runs.
No timing is asserted.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "scripts/gpu_check.py", "--smoke"]


def _env(**extra):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("OUT", None)
    env.update(extra)
    return env


def _run(args, env=None, timeout=300):
    return subprocess.run(
        SCRIPT + args, cwd=REPO, env=env or _env(), capture_output=True, text=True, timeout=timeout
    )


def _stages(path):
    rep = json.loads(Path(path).read_text())
    return rep, {k: v["status"] for k, v in rep["stages"].items()}


def _gone(pid, wait_s=20.0):
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_stage_leaves_json_with_done_and_interrupted_stage(tmp_path, sig):
    """SIGTERM / SIGINT while the kernel stage's pytest child runs: the JSON has preflight done,
    kernels 'interrupted' with the signal's name, the rest 'not_run'; the child is killed too."""
    out = tmp_path / "gpu-check.json"
    p = subprocess.Popen(
        SCRIPT + ["--stages", "preflight,kernels,attention", "--out", str(out)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for ln in p.stdout:
        seen.append(ln)
        if ln.startswith("[gpu-check] kernels") and "started" in ln:
            break
    else:
        pytest.fail("kernels stage never started: " + "".join(seen)[-2000:])
    # wait until the child is recorded (the report is rewritten when it starts)
    for _ in range(100):
        rep, _ = _stages(out)
        if "child_pid" in rep["stages"]["kernels"]:
            break
        time.sleep(0.1)
    child = rep["stages"]["kernels"]["child_pid"]
    p.send_signal(sig)
    rest, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + sig
    rep, st = _stages(out)
    assert st == {"preflight": "info", "kernels": "interrupted", "attention": "not_run"}
    assert rep["stages"]["kernels"]["reason"] == signal.Signals(sig).name
    assert rep["interrupted"]["stage"] == "kernels" and rep["finished"] is True
    assert rep["verdict"] == "INCOMPLETE"
    assert "[gpu-check] kernels   INTR interrupted" in rest and "VERDICT INCOMPLETE" in rest
    assert _gone(child), "the kernel stage's pytest child outlived the check"
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_raising_stage_does_not_stop_the_next_stages(tmp_path):
    out = tmp_path / "r.json"
    r = _run(
        ["--stages", "preflight,kernels,attention", "--fault", "kernels=raise", "--out", str(out)]
    )
    rep, st = _stages(out)
    assert st == {"preflight": "info", "kernels": "error", "attention": "info"}, r.stdout[-2000:]
    assert "injected fault" in rep["stages"]["kernels"]["traceback"]
    assert rep["stages"]["attention"]["chosen"] in rep["stages"]["attention"]["variants"]
    assert rep["verdict"] == "FAIL" and r.returncode == 1
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[gpu-check]")]
    assert any(ln.split()[1:3] == ["kernels", "ERR"] for ln in lines)
    assert any(ln.split()[1:3] == ["attention", "info"] for ln in lines)


def test_sticky_cuda_error_ends_device_stages_but_not_the_report(tmp_path):
    out = tmp_path / "s.json"
    r = _run(
        [
            "--stages",
            "preflight,kernels,bigpool,attention",
            "--fault",
            "kernels=sticky",
            "--out",
            str(out),
        ]
    )
    rep, st = _stages(out)
    assert st == {
        "preflight": "info",
        "kernels": "error",
        "bigpool": "not_run",
        "attention": "not_run",
    }
    assert "CUDA context unusable" in rep["stages"]["bigpool"]["reason"]
    assert rep["finished"] and rep["verdict"] == "FAIL" and r.returncode == 1


def test_not_run_for_time_is_not_fail(tmp_path):
    """A budget spent before a stage starts: the stage is 'not run', nothing is built for it, and
    the verdict is INCOMPLETE (exit 2), never FAIL."""
    out = tmp_path / "t.json"
    r = _run(
        ["--budget-s", "0", "--stages", "preflight,kernels,numerics,bigpool", "--out", str(out)]
    )
    rep, st = _stages(out)
    assert st == {
        "preflight": "info",
        "kernels": "not_run",
        "numerics": "not_run",
        "bigpool": "not_run",
    }
    assert all(
        "time budget" in rep["stages"][s]["reason"] for s in ("kernels", "numerics", "bigpool")
    )
    assert (
        "results" not in rep["stages"]["numerics"] and "child_pid" not in rep["stages"]["kernels"]
    )
    assert rep["verdict"] == "INCOMPLETE" and r.returncode == 2
    assert "FAIL" not in r.stdout


def test_watchdog_writes_before_a_hung_stage_is_killed(tmp_path):
    out = tmp_path / "w.json"
    r = _run(
        [
            "--stages",
            "preflight,kernels,attention",
            "--fault",
            "kernels=hang",
            "--hard-limit-s",
            "10",
            "--out",
            str(out),
        ]
    )
    rep, st = _stages(out)
    assert r.returncode == 124
    assert st == {"preflight": "info", "kernels": "interrupted", "attention": "not_run"}
    assert rep["stages"]["kernels"]["reason"].startswith("watchdog")


def test_out_defaults_under_OUT_and_out_flag_wins(tmp_path):
    outdir = tmp_path / "OUT"
    r = _run(["--budget-s", "0", "--stages", "preflight"], env=_env(OUT=str(outdir)))
    assert r.returncode == 2
    rep, st = _stages(outdir / "gpu-check.json")
    assert st == {"preflight": "info"} and rep["finished"]
    other = tmp_path / "deep" / "x.json"
    _run(
        ["--budget-s", "0", "--stages", "preflight", "--out", str(other)], env=_env(OUT=str(outdir))
    )
    assert other.exists()
    assert json.loads(other.read_text())["stages"]["preflight"]["status"] == "info"


@pytest.mark.slow
def test_gpu_check_smoke_mode_passes_and_writes_json(tmp_path):
    out = tmp_path / "gpu-check.json"
    r = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[gpu-check]")]
    for stage in (
        "preflight",
        "kernels",
        "numerics",
        "bigpool",
        "graphs",
        "kvquant",
        "attention",
        "speed",
    ):
        assert any(ln.split()[1] == stage and "started" not in ln for ln in lines), (
            f"no line for stage {stage}"
        )
    assert lines[-1].startswith("[gpu-check] VERDICT PASS")
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "PASS" and rep["mode"] == "smoke" and rep["finished"]
    st = rep["stages"]
    assert {k: v["status"] for k, v in st.items()} == {
        "preflight": "info",
        "kernels": "pass",
        "numerics": "pass",
        "bigpool": "pass",
        "graphs": "pass",
        "kvquant": "info",
        "attention": "info",
        "speed": "info",
    }
    num = st["numerics"]["results"]
    assert [r["dtype"] for r in num] == ["bfloat16", "float32"] and all(r["ok"] for r in num)
    assert all(r["rows_compared"] > 10 and r["prefix_cache_hits_tokens"] > 0 for r in num)
    big = st["bigpool"]
    assert (
        big["store_exact"]
        and big["rope_store_exact"]
        and big["copy_exact"]
        and big["attention_ok"]
        and big["prefill_ok"]
    )
    assert st["graphs"]["identical"] == st["graphs"]["sequences"]
    kq = st["kvquant"]["int8"]
    assert (
        kq["graphs"]["kv_cache_dtype"] == "int8"
        and kq["graphs"]["identical"] == kq["graphs"]["sequences"]
    )
    assert kq["numerics"]["kv_cache_dtype"] == "int8" and kq["numerics"]["rows_compared"] > 10
    assert (
        0.5 <= kq["numerics"]["argmax_agreement"] <= 1
        and st["kvquant"]["unquantized"]["argmax_agreement"] == 1
    )
    for kind in ("graphs", "eager", "hf_generate"):
        assert isinstance(st["speed"][kind]["1"]["greedy"], float)
    assert {t["target"] for t in rep["targets"]} >= {"CUDA graphs >= 3x eager at batch 1"}
