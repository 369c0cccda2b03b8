"""scripts/gpu_check.sh --smoke: the GPU check's every stage runs on CPU (tiny shapes, interpreted
Triton) and writes its JSON, so the script cannot rot between GPU runs. No timing is asserted."""
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_smoke_mode_passes_and_writes_json(tmp_path):
    out = tmp_path / "gpu-check.json"
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "--smoke", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[gpu-check]")]
    for stage in ("env", "kernels", "numerics", "bigpool", "attention", "speed"):
        assert any(ln.split()[1] == stage for ln in lines), f"no line for stage {stage}"
    assert lines[-1].startswith("[gpu-check] VERDICT PASS")
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "PASS" and rep["mode"] == "smoke"
    num = rep["numerics"]["results"]
    assert {r["dtype"] for r in num} == {"float32", "bfloat16"} and all(r["ok"] for r in num)
    assert all(r["rows_compared"] > 10 and r["prefix_cache_hits_tokens"] > 0 for r in num)
    assert rep["bigpool"]["store_exact"] and rep["bigpool"]["copy_exact"] and rep["bigpool"]["attention_ok"]
    for kind in ("graphs", "eager", "hf_generate"):
        assert isinstance(rep["speed"][kind]["1"]["greedy"], float)
    assert {t["target"] for t in rep["targets"]} >= {"CUDA graphs >= 3x eager at batch 1"}
