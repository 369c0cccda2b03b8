"""The one prepared GPU check: `bash scripts/gpu_check.sh --out "$OUT/gpu-check.json"` on the GPU machine.

Stages, in this order (correctness first, so its verdict is complete early; speed last, with what
time is left), one line each on stdout, and the JSON rewritten after every one:
  preflight versions, compiler / Python.h for Triton's launcher, free memory, SMs, a tiny Triton launch
  kernels   the GPU kernel tests (tests/kernels minus the CPU-only C++ tests, fused forward)
  numerics  engine vs HF on the same random weights per shipped config, bf16 first, then fp32
  bigpool   a pool at 80% of free memory used at its highest block ids (store, rope_and_store,
            decode and prefill attention, copy past 2^31 elements)
  graphs    CUDA-graph replay vs eager on the same batch: greedy tokens identical
  kvquant   int8 / fp8 KV pools: graphs vs eager identical; error vs HF fp32 beside the bf16 pool's
  attention decode attention GB/s per decode variant vs copy bandwidth; picks the faster variant
  speed     decode tok/s at batch 1/8/64/256, engine eager vs CUDA graphs vs HF generate
Why it is built like this (issue 27): the lent machine returns only the output folder and the
printed tail of one command, so the result must survive a time-out, a crash, a sticky CUDA error
and a cold Triton cache. See scripts/gpu_check_report.py (atomic JSON, statuses, verdict) and
scripts/gpu_check_guard.py (SIGTERM / SIGINT / watchdog). Every stage checks the budget before it
builds anything; one skipped for time is "not run", never FAIL. --smoke runs tiny shapes on CPU
with interpreted Triton so CI keeps this script from rotting (tests/test_gpu_check_smoke.py);
--fault STAGE=raise|hang|sticky is for those tests only (it replaces that stage's body).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_check_guard import Guard  # noqa: E402
from gpu_check_preflight import preflight  # noqa: E402
from gpu_check_report import Report, line  # noqa: E402

CONFIGS = ["llama-3.2-1b", "qwen2.5-0.5b", "llama-3-8b"]
STAGES = ["preflight", "kernels", "numerics", "bigpool", "graphs", "kvquant", "attention", "speed"]
# cold-cache estimates on an H200 (seconds): a stage starts only if this much budget is left
# (docs/BENCHMARKS.md "GPU check: cold compiles" has where they come from); smoke mode uses 0
COLD_S = {
    "kernels": 90,
    "numerics_config": 25,
    "bigpool": 25,
    "graphs": 40,
    "kvquant": 40,
    "attention": 15,
    "speed_engine": 45,
    "speed_hf": 20,
}
KERNEL_TESTS = [
    "tests/kernels",
    "tests/engine/exec/test_fused_forward.py",
    "--ignore-glob=tests/kernels/test_cpu_*",
]


class Check:
    def __init__(self, a, device: str, report: Report, guard: Guard):
        self.a, self.device, self.report, self.guard = a, device, report, guard
        self.deadline = time.monotonic() + a.budget_s
        self.cuda_broken: str | None = None
        self.blocked: dict[str, str] = {}
        self.faults = dict(f.split("=", 1) for f in a.fault)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def cold(self, key: str) -> float:
        return 0.0 if self.a.smoke else COLD_S[key]

    # --- stages (each returns status, one-line message, data) ---------------------------
    def preflight(self):
        status, msg, data, self.blocked = preflight(self.device)
        return status, msg, data

    def kernels(self):
        pytest_args = [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            "timeout=0",
        ]
        if self.a.smoke:
            args = pytest_args + [
                "tests/kernels/test_attention_lowp.py",
                "tests/kernels/test_fused.py",
                "-k",
                "(16-64-8-2 and triton and decode) or round or (576 and bfloat16) or split_k",
            ]
        else:
            args = pytest_args + KERNEL_TESTS + ["-k", "not sm90"]
        reserve = 0 if self.a.smoke else COLD_S["numerics_config"] * 2 + COLD_S["bigpool"]
        limit = max(30.0, self.remaining() - reserve)
        try:
            r = self.guard.run_child(
                args,
                timeout=limit,
                cwd=REPO,
                on_start=lambda pid: self.report.note("kernels", child_pid=pid),
            )
            out, rc, timed_out = r.stdout, r.returncode, False
        except subprocess.TimeoutExpired as e:
            out = e.output or ""
            if isinstance(out, bytes):
                out = out.decode(errors="replace")
            rc, timed_out = None, True
        passed = len(re.findall(r" PASSED", out))
        failed = sorted(set(re.findall(r"^(\S+::\S+) (?:FAILED|ERROR)", out, re.M)))
        data = {
            "returncode": rc,
            "passed": passed,
            "failed": failed,
            "timed_out": timed_out,
            "tail": out[-3000:] if (rc or timed_out) else "",
        }
        if failed:
            return (
                "fail",
                f"{len(failed)} failed, {passed} passed"
                + (" (then timed out)" if timed_out else ""),
                data,
            )
        if timed_out:
            return (
                "not_run",
                f"time: killed after {limit:.0f} s with {passed} passed, none failed",
                data,
            )
        summary = (out.strip().splitlines() or ["(no output)"])[-1].strip("= ")
        return ("pass" if rc == 0 else "fail"), summary, data

    def numerics(self):
        from check_numerics import check_config

        dts = ("bfloat16", "float32")
        plan = (
            [("smollm2-135m", dt, 2) for dt in dts]
            if self.a.smoke
            else [(c, dt, 4) for dt in dts for c in CONFIGS]
        )  # bf16 for every config first
        over = {"vocab_size": 4096} if self.a.smoke else None
        results = []
        for name, dt, layers in plan:
            if self.remaining() < self.cold("numerics_config"):
                results.append({"config": name, "dtype": dt, "ok": None, "not_run": "time budget"})
                line("numerics", "skip", f"{name} {dt}: not run (time budget)")
                continue
            try:
                r = check_config(name, dt, self.device, layers, self.a.smoke, over)
            except Exception as e:  # noqa: BLE001 - one config's error is that config's result
                r = {
                    "config": name,
                    "dtype": dt,
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-2000:],
                }
                self.check_cuda(f"numerics {name} {dt}")
            results.append(r)
            self.report.set("numerics_progress", results)
            err = r.get("max_abs_err_vs_hf_fp32")
            line(
                "numerics",
                "ok  " if r["ok"] else "FAIL",
                f"{name} {dt}: "
                + (
                    f"max err {err:.3g} ({r['rule']}), {r['rows_compared']} rows"
                    if err is not None
                    else r.get("error", "?")
                ),
            )
            if self.cuda_broken:
                break
        ran = [r for r in results if r["ok"] is not None]
        msg = (
            f"{sum(1 for r in ran if r['ok'])}/{len(ran)} configs within the rules, "
            f"{len(plan) - len(ran)} not run"
        )
        if not ran:
            return "not_run", msg, {"results": results}
        return ("pass" if all(r["ok"] for r in ran) else "fail"), msg, {"results": results}

    def bigpool(self):
        from check_big_pool import check_big_pool

        smoke = self.a.smoke
        r = check_big_pool(
            self.device,
            max_bytes=(32 << 20) if smoke else None,
            backend="triton" if smoke else None,
            d=64 if smoke else 128,
            kvh=2 if smoke else 8,
        )
        parts = ", ".join(
            f"{k} {r[k]}"
            for k in ("store_exact", "rope_store_exact", "attention_ok", "prefill_ok", "copy_exact")
        )
        return (
            ("pass" if r["ok"] else "fail"),
            (
                f"{r['num_blocks']} blocks ({r['pool_gib']:.1f} GiB), max offset {r['max_element_offset']:.3g}"
                f"{' > 2^31' if r['offsets_past_int32'] else ''}: {parts}"
            ),
            r,
        )

    def graphs(self):
        from check_graphs import graphs_vs_eager

        r = graphs_vs_eager(self.device, self.a.smoke)
        return (
            ("pass" if r["ok"] else "fail"),
            (
                f"{r['sequences']} seqs x {r['new_tokens']} tokens, graphs {'on' if r['cuda_graphs'] else 'OFF (no CUDA)'}: "
                f"{r['identical']}/{r['sequences']} token-identical"
            ),
            r,
        )

    def kvquant(self):
        """The quantized pools end to end: graphs vs eager token-identical on an int8 / fp8 pool (a
        rule), and the numerics workload's error vs HF fp32 beside the unquantized pool's (reported:
        no rule yet, the first device run saw greedy tokens drift on random weights)."""
        from check_graphs import graphs_vs_eager
        from check_numerics import check_config

        smoke = self.a.smoke
        name, dt, layers = (
            ("smollm2-135m", "float32", 2) if smoke else ("llama-3.2-1b", "bfloat16", 4)
        )
        over = {"vocab_size": 4096} if smoke else None
        rows, cells, ok = {}, [], True
        done = [
            r
            for r in self.report.data.get("numerics_progress") or []  # the numerics stage's run
            if r.get("config") == name
            and r.get("dtype") == dt
            and r.get("layers") == layers
            and r.get("ok")
        ]
        base = done[0] if done else check_config(name, dt, self.device, layers, smoke, over)
        for kvd in ["int8"] if self.device != "cuda" else ["int8", "fp8"]:
            g = graphs_vs_eager(self.device, smoke, kvd)
            n = check_config(name, dt, self.device, layers, smoke, over, kv_cache_dtype=kvd)
            ok &= g["ok"]
            rows[kvd] = {"graphs": g, "numerics": n}
            cells.append(
                f"{kvd}: graphs {g['identical']}/{g['sequences']} identical, max err {n['max_abs_err_vs_hf_fp32']:.3g}, "
                f"argmax {100 * n['argmax_agreement']:.0f}%"
            )
        msg = (
            f"{name} {dt}, {dt} pool max err {base['max_abs_err_vs_hf_fp32']:.3g} argmax "
            f"{100 * base['argmax_agreement']:.0f}%; " + "; ".join(cells)
        )
        return ("info" if ok else "fail"), msg, {"unquantized": base, **rows}

    def attention(self):
        from check_speed import attention_bandwidth
        from kernels import triton_attention as ta

        smoke = self.a.smoke
        rows = {}
        for name in ta.DECODE_VARIANTS:
            with ta.decode_variant(name):
                rows[name] = attention_bandwidth(
                    self.device,
                    "float32" if smoke else "bfloat16",
                    4 if smoke else 64,
                    256 if smoke else 4096,
                    kvh=2 if smoke else 8,
                    heads=4 if smoke else 32,
                    reps=2 if smoke else 20,
                )
        best = max(rows, key=lambda n: rows[n]["attention_gb_s"])
        ta.set_decode_variant(best)  # what the speed stage then runs
        r = dict(rows[best], variants=rows, chosen=best)
        cells = "; ".join(f"{n} {v['attention_gb_s']:.0f} GB/s" for n, v in rows.items())
        return (
            "info",
            f"batch {r['batch']} x {r['context']}: {cells}; copy {r['copy_gb_s']:.0f} GB/s; "
            f"chosen {best} ({100 * r['ratio']:.0f}% of copy)",
            r,
        )

    def speed(self):
        from check_speed import engine_decode, hf_decode

        smoke = self.a.smoke
        name = "smollm2-135m" if smoke else "llama-3.2-1b"
        over = {"num_hidden_layers": 2, "vocab_size": 4096} if smoke else None
        dt = "float32" if smoke else "bfloat16"
        batches = [1, 4] if smoke else [1, 8, 64, 256]
        plen, new = (8, 8) if smoke else (128, 64)
        out = {"model": name, "dtype": dt, "prompt_len": plen, "new_tokens": new}
        for kind, cost in (
            ("graphs", "speed_engine"),
            ("eager", "speed_engine"),
            ("hf_generate", "speed_hf"),
        ):
            if self.remaining() < self.cold(cost):  # checked before building the engine
                out[kind] = "not run: time budget"
                continue
            if kind == "hf_generate":
                out[kind] = hf_decode(
                    name, self.device, dt, batches, plen, new, over, self.deadline
                )
            else:
                out[kind] = engine_decode(
                    name, self.device, dt, batches, plen, new, kind == "eager", over, self.deadline
                )
        f = lambda x: (
            f"{x['greedy']:.0f}"
            if isinstance(x, dict) and isinstance(x.get("greedy"), float)
            else "-"
        )
        cell = lambda k, b: f(out[k].get(b)) if isinstance(out[k], dict) else "-"
        cells = [
            f"b{b}: graphs {cell('graphs', b)} / eager {cell('eager', b)} / HF {cell('hf_generate', b)}"
            for b in batches
        ]
        return "info", "greedy decode tok/s " + "; ".join(cells), out

    # --- the loop -------------------------------------------------------------------------
    def run_stage(self, name: str) -> None:
        if name != "preflight":
            if self.cuda_broken:
                return self.report.not_run(name, f"CUDA context unusable after {self.cuda_broken}")
            if name in self.blocked:
                return self.report.not_run(name, self.blocked[name])
            need = {
                "kernels": self.cold("kernels"),
                "numerics": self.cold("numerics_config"),
                "bigpool": self.cold("bigpool"),
                "graphs": self.cold("graphs"),
                "kvquant": self.cold("kvquant"),
                "attention": self.cold("attention"),
                "speed": self.cold("speed_engine"),
            }[name]
            if self.remaining() < max(need, 1.0):
                return self.report.not_run(
                    name, f"time budget ({self.remaining():.0f} s left, needs ~{need:.0f} s cold)"
                )
        self.report.start(name)
        try:
            fault = self.faults.get(name)
            if fault == "raise":
                raise RuntimeError(f"injected fault in stage {name}")
            if fault == "hang":
                time.sleep(3600)
            if fault == "sticky":
                self.cuda_broken = name  # as check_cuda() finds after one
                raise RuntimeError(
                    "CUDA error: an illegal memory access was encountered (injected)"
                )
            status, msg, data = getattr(self, name)()
        except Exception as e:  # noqa: BLE001 - a stage's exception is its result; the next stage runs
            status, msg = "error", f"{type(e).__name__}: {str(e)[:300]}"
            data = {"traceback": traceback.format_exc()[-3000:]}
            self.check_cuda(name)
        self.report.finish(name, status, msg, data if isinstance(data, dict) else {"data": data})
        self.cleanup(name)

    def check_cuda(self, where: str) -> None:
        """After an error: is the CUDA context still usable? (an illegal address is sticky)"""
        if self.device != "cuda" or self.cuda_broken:
            return
        try:
            import torch

            torch.cuda.synchronize()
            (torch.ones(1, device="cuda") + 1).item()
        except Exception as e:  # noqa: BLE001
            self.cuda_broken = f"{where} ({type(e).__name__}: {str(e)[:120]})"
            line(
                where.split()[0],
                "ERR ",
                "CUDA context unusable: the remaining CUDA stages are not run",
            )

    def cleanup(self, name: str) -> None:
        try:
            gc.collect()
            if self.device == "cuda" and not self.cuda_broken:
                import torch

                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - cleanup failing is itself a finding
            self.report.data["stages"][name]["cleanup_error"] = f"{type(e).__name__}: {e}"
            self.check_cuda(f"{name} cleanup")
            self.report.write()


def targets(stages: dict, device: str) -> list[dict]:
    """The performance targets, from what was measured (meaningful only on the GPU run)."""
    from check_speed import weight_bandwidth_bound

    out = []
    sp, at = stages.get("speed", {}), stages.get("attention", {})
    g, e, h = (
        sp.get(k) if isinstance(sp.get(k), dict) else {} for k in ("graphs", "eager", "hf_generate")
    )
    ok = lambda x: isinstance(x, dict) and isinstance(x.get("greedy"), float)
    if ok(g.get(1)) and at.get("copy_gb_s"):
        bound = weight_bandwidth_bound(
            sp["model"],
            None if device == "cuda" else {"num_hidden_layers": 2, "vocab_size": 4096},
            sp["dtype"],
            at["copy_gb_s"],
        )
        out.append(
            {
                "target": "batch-1 decode >= 60% of weight-bandwidth bound",
                "value": g[1]["greedy"] / bound,
                "met": g[1]["greedy"] >= 0.6 * bound,
            }
        )
    if ok(g.get(64)) and ok(h.get(64)):
        out.append(
            {
                "target": "batch 64 >= 3x HF generate",
                "value": g[64]["greedy"] / h[64]["greedy"],
                "met": g[64]["greedy"] >= 3 * h[64]["greedy"],
            }
        )
    if at.get("ratio") is not None:
        out.append(
            {
                "target": "decode attention >= 60% of copy bandwidth (4k)",
                "value": at["ratio"],
                "met": at["ratio"] >= 0.6,
            }
        )
    if ok(g.get(1)) and ok(e.get(1)):
        out.append(
            {
                "target": "CUDA graphs >= 3x eager at batch 1",
                "value": g[1]["greedy"] / e[1]["greedy"],
                "met": g[1]["greedy"] >= 3 * e[1]["greedy"],
            }
        )
    return out


def default_out(mode: str) -> Path:
    """Under $OUT when it is set (what the lent machine brings back), else bench/results/."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu-check.json"
    return REPO / "bench" / "results" / f"gpu-check-{mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes on CPU, interpreted Triton (CI)"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=float(os.environ.get("GPU_CHECK_BUDGET_S", 480)),
        help="wall-clock budget: no stage starts building without its cold estimate left (default 480)",
    )
    ap.add_argument(
        "--hard-limit-s",
        type=float,
        default=None,
        help="watchdog: write and exit at this many seconds (default budget + 60)",
    )
    ap.add_argument(
        "--out", default=None, help="JSON path (default $OUT/gpu-check.json, else bench/results/)"
    )
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument(
        "--fault", action="append", default=[], help="tests only: STAGE=raise|hang|sticky"
    )
    a = ap.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        ap.error(f"unknown stages {unknown}; known: {STAGES}")
    import torch

    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if device == "cpu" and not a.smoke:
        print("[gpu-check] no CUDA device: running the smoke mode instead (--smoke)", flush=True)
        a.smoke = True
    mode = "smoke" if a.smoke else "full"
    report = Report(Path(a.out) if a.out else default_out(mode), mode, stages)
    report.set("budget_s", a.budget_s)
    guard = Guard(report, a.hard_limit_s if a.hard_limit_s is not None else a.budget_s + 60)
    line(
        "start",
        "info",
        f"{mode} mode, budget {a.budget_s:.0f} s, stages {','.join(stages)} -> {report.path}",
    )
    check = Check(a, device, report, guard)
    for name in stages:
        check.run_stage(name)
    try:
        report.set("targets", targets(report.data["stages"], device))
    except Exception as e:  # noqa: BLE001
        report.set("targets_error", f"{type(e).__name__}: {e}")
    for t in report.data.get("targets", []):
        line(
            "target",
            "ok  " if t["met"] else "miss",
            f"{t['target']}: {t['value']:.2f}"
            + ("" if device == "cuda" else " (smoke: not meaningful)"),
        )
    guard.disarm()
    report.close()
    return {"PASS": 0, "FAIL": 1}.get(report.data["verdict"], 2)


if __name__ == "__main__":
    sys.exit(main())
