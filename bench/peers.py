"""python -m bench --peers: the engine beside llama.cpp and vLLM-CPU, each peer at its best (issue 49).

    python -m bench --peers --llama-dir DIR --gguf-dir DIR [--vllm-python PATH]
                    [--dtypes float32,bfloat16,int8] [--burst-dtypes float32,bfloat16]
                    [--rounds 2] [--busy] [--quick] [--json OUT]

Why this shape: earlier ratios ran llama.cpp inside a process where the engine's threads were alive
and interleaved, and it decoded at half to a fifth of what the same build does alone. Here this
process imports neither torch nor the engine: every system runs in a child process of its own, one
after the other, and each peer is checked in the same run against its own reference figure:
  llama.cpp  `llama-bench -p 0 -n 128` (same build, same GGUF, same threads) just before its server
             run; the server's decode rate (timings.predicted_per_second, median over the prompts)
  vLLM-CPU   its offline `LLM.generate` on one request (bench/vllm_runner.py run_reference) against
             the same request through its serving path (AsyncLLM) in the burst's process
A peer below 85% of its reference prints "peer handicapped" instead of a ratio. Every ratio line
names the command, the commit, the load average at that moment and the peer's reference.

Sections:
  single   one chat at a time (6 prompts, 128 greedy tokens, EOS ignored): engine fp32 vs llama-server
           F32, engine bf16 vs BF16, engine int8 weights vs Q8_0; `--rounds` rounds, alternating who
           goes first; same greedy ids counted (fp32 should agree).
  burst    16 chats on a shared ~550-token prompt (bench/peer_engine.py), 128 new tokens, all at once:
           engine vs vLLM-CPU (same ids, same dtype), output tok/s and TTFT p50.
  busy     (--busy) single stream again while another process keeps one core busy: engine fp32 and
           llama-server F32, each against its own quiet figure of this run.
GGUF files expected in --gguf-dir: SmolLM2-135M-Instruct-{F32,BF16,Q8_0}.gguf (docs/BENCHMARKS.md says
how to make them with the build's llama-quantize; llama.cpp is never fetched or built by this repo).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench import llama_cpp_peer as lc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDICAP = 0.85
GGUF = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0"}


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_others(threshold: float = 20.0) -> list[str]:
    """Other processes using the CPU right now (ps, %CPU over their life; a hint, not a measure)."""
    r = subprocess.run(
        ["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True
    )
    me = os.getpid()
    out = []
    for line in r.stdout.splitlines()[1:8]:
        pid, pcpu, comm = line.split(None, 2)
        if int(pid) != me and float(pcpu) >= threshold:
            out.append(f"{comm} ({pcpu}%)")
    return out


def child(kind: str, job: dict, tmp: str, timeout: int = 3600) -> dict:
    """One engine child process (bench/peer_engine.py); nothing of it is left when this returns."""
    jp, op = os.path.join(tmp, f"{kind}-job.json"), os.path.join(tmp, f"{kind}-out.json")
    with open(jp, "w") as f:
        json.dump(job, f)
    r = subprocess.run(
        [sys.executable, "-m", "bench.peer_engine", kind, jp, op],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    with open(op) as f:
        return json.load(f)


def vllm_child(a, job: dict, tmp: str) -> dict:
    jp = os.path.join(tmp, f"vllm-{job['kind']}-job.json")
    with open(jp, "w") as f:
        json.dump(job, f)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH="")
    for kv in a.vllm_env:
        k, _, v = kv.partition("=")
        env[k] = v
    r = subprocess.run(
        [a.vllm_python, os.path.join(REPO, "bench", "vllm_runner.py"), jp, jp + ".out"],
        env=env,
        capture_output=True,
        text=True,
        timeout=a.vllm_timeout,
    )
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    with open(jp + ".out") as f:
        return json.load(f)


def llama_single(a, dtype: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """llama-bench's reference, then llama-server on the prompts (after one warm-up request)."""
    gguf = os.path.join(a.gguf_dir, f"SmolLM2-135M-Instruct-{GGUF[dtype]}.gguf")
    res = {"gguf": gguf, "load_start": load(), "others_busy": busy_others()}
    res["reference"] = lc.reference(
        os.path.join(a.llama_dir, "llama-bench"),
        gguf,
        a.threads,
        new_tokens,
        reps=2 if a.quick else 3,
    )
    if (
        a.threads > 1
    ):  # a busy machine shows as more threads being slower than one (spinning threads)
        res["reference_1_thread"] = lc.reference(
            os.path.join(a.llama_dir, "llama-bench"), gguf, 1, new_tokens, reps=2
        )
    with lc.Server(os.path.join(a.llama_dir, "llama-server"), gguf, a.threads) as srv:
        srv.complete(prompts[0], 16)  # warm-up
        outs = [srv.complete(p, new_tokens) for p in prompts]
    res["rates"] = [o["timings"].get("predicted_per_second") for o in outs]
    res["token_ids"] = [o["tokens"] for o in outs]
    res["load_end"] = load()
    return res


def med(xs) -> float | None:
    xs = [x for x in xs if x]
    return round(statistics.median(xs), 2) if xs else None


def verdict(
    engine: float | None, peer: float | None, ref: float | None, ref_1_thread: float | None = None
) -> str:
    """The ratio, or why there is none. ref_1_thread: the peer's reference on one thread; when its
    reference on the bench's threads is lower, the machine is busy (llama.cpp's threads spin and
    wait on each other when a core is taken: 2 threads measured 1.5 tok/s against 18.7 on one at
    load ~6 here), and no ratio means anything."""
    if not engine or not peer:
        return "not measured"
    if ref and ref_1_thread and ref < ref_1_thread:
        return f"peer handicapped (machine busy: its reference {ref:.1f} < {ref_1_thread:.1f} on one thread)"
    if not ref or peer < HANDICAP * ref:
        return f"peer handicapped ({peer:.1f} < {HANDICAP:.0%} of its reference {ref or 0:.1f})"
    return f"{engine / peer:.2f}x"


def run_single(a, job: dict, tmp: str, out: dict) -> None:
    rows = out.setdefault("single", {})
    for dtype in a.dtypes:
        ejob = dict(
            job,
            dtype="bfloat16" if dtype == "int8" else dtype,
            quantization="int8" if dtype == "int8" else None,
        )
        rounds = []
        for r in range(a.rounds):
            rnd = {"load_start": load()}
            order = ("engine", "llama") if r % 2 == 0 else ("llama", "engine")
            for who in order:
                if who == "engine":
                    rnd["engine"] = child("single", ejob, tmp)
                    rnd["engine_load_end"] = load()
                elif a.llama_dir:
                    rnd["llama"] = llama_single(a, dtype, job["single"], job["new_tokens"])
            rounds.append(rnd)
            print(
                f"single {dtype} round {r}: engine {med(rnd['engine'].get('rates', []))}, llama-server "
                f"{med(rnd.get('llama', {}).get('rates', []))}, llama-bench "
                f"{rnd.get('llama', {}).get('reference', {}).get('tok_s')}, load {load()}",
                file=sys.stderr,
            )
        e = med([med(x["engine"].get("rates", [])) for x in rounds])
        l_ = med([med(x.get("llama", {}).get("rates", [])) for x in rounds])
        ref = med([x.get("llama", {}).get("reference", {}).get("tok_s") for x in rounds])
        ref1 = med([x.get("llama", {}).get("reference_1_thread", {}).get("tok_s") for x in rounds])
        same = None
        if rounds and "llama" in rounds[0] and "token_ids" in rounds[0]["engine"]:
            same = sum(
                x == y
                for x, y in zip(rounds[0]["engine"]["token_ids"], rounds[0]["llama"]["token_ids"])
            )
        rows[dtype] = {
            "rounds": rounds,
            "engine_tok_s": e,
            "llama_server_tok_s": l_,
            "llama_bench_tok_s": ref,
            "llama_bench_1_thread_tok_s": ref1,
            "ratio": verdict(e, l_, ref, ref1),
            "same_ids": same,
            "load": load(),
        }


def run_burst(a, job: dict, tmp: str, out: dict) -> None:
    rows = out.setdefault("burst", {})
    for dtype in a.burst_dtypes:
        ejob = dict(job, dtype=dtype, reps=a.rounds)
        vjob = dict(job, dtype=dtype, reps=a.rounds, model=job["model"])
        row = {"load_start": load(), "others_busy": busy_others()}
        row["engine"] = child("burst", ejob, tmp)
        row["engine"].pop("token_ids_all", None)
        if a.vllm_python:
            row["vllm_reference"] = vllm_child(a, dict(vjob, kind="reference"), tmp)
            row["vllm"] = vllm_child(a, dict(vjob, kind="burst"), tmp)
        row["load_end"] = load()
        e = row["engine"].get("tokens_per_s")
        v = row.get("vllm", {})
        bursts = v.get("bursts") or []
        best = max(bursts, key=lambda b: b["tokens_per_s"]) if bursts else {}
        one = (v.get("one_request") or {}).get("tokens_per_s")
        ref = (row.get("vllm_reference") or {}).get("offline_one_request_tok_s")
        row["vllm_tok_s"], row["vllm_one_request_tok_s"], row["vllm_reference_tok_s"] = (
            best.get("tokens_per_s"),
            one,
            ref,
        )
        row["ratio"] = (
            verdict(e, best.get("tokens_per_s"), None)
            if not one
            else (
                f"peer handicapped (one request {one:.1f} < {HANDICAP:.0%} of offline {ref or 0:.1f})"
                if not ref or one < HANDICAP * ref
                else f"{e / best['tokens_per_s']:.2f}x"
                if e
                else "not measured"
            )
        )
        row["ttft_p50_engine_s"], row["ttft_p50_vllm_s"] = (
            row["engine"].get("ttft_p50_s"),
            best.get("ttft_p50_s"),
        )
        ids = best.get("token_ids")
        if ids and row["engine"].get("token_ids"):
            row["same_ids"] = (
                f"{sum(x == y for x, y in zip(ids, row['engine']['token_ids']))}/{len(ids)}"
            )
        for b in bursts:
            b.pop("token_ids", None)
        row["engine"].pop("token_ids", None)
        rows[dtype] = row
        print(
            f"burst {dtype}: engine {e}, vLLM {row['vllm_tok_s']} (one request {one}, offline {ref}): "
            f"{row['ratio']}",
            file=sys.stderr,
        )


def run_busy(a, job: dict, tmp: str, out: dict) -> None:
    """Single stream fp32 with one core kept busy by another process (a spinning Python)."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(2)
        small = dict(job, single=job["single"][:3], dtype="float32", quantization=None)
        res = {"load_start": load(), "engine": child("single", small, tmp)}
        if a.llama_dir:
            res["llama"] = llama_single(a, "float32", small["single"], job["new_tokens"])
        res["load_end"] = load()
    finally:
        spin.kill()
        spin.wait()
    quiet = out.get("single", {}).get("float32", {})
    e, l_ = med(res["engine"].get("rates", [])), med(res.get("llama", {}).get("rates", []))
    res["engine_busy_over_quiet"] = (
        round(e / quiet["engine_tok_s"], 3) if e and quiet.get("engine_tok_s") else None
    )
    res["llama_busy_over_quiet"] = (
        round(l_ / quiet["llama_server_tok_s"], 3)
        if l_ and quiet.get("llama_server_tok_s")
        else None
    )
    res["engine_tok_s"], res["llama_server_tok_s"] = e, l_
    out["busy"] = res


def render(out: dict) -> str:
    head = (
        f"`{out['command']}` — commit {out['commit']}, {out['machine']}, load average at start "
        f"{out['load_start']}, at end {out.get('load_end')}, {out.get('elapsed_s', 0):.0f} s"
    )
    lines = [f"# Engine beside its peers ({out['started']})", "", head, ""]
    if out.get("single"):
        lines += [
            "## One chat at a time (decode tok/s, median of prompts and rounds)",
            "",
            "| weights | engine | llama-server | llama-bench tg (its reference; 1 thread) | engine / llama-server | "
            "same greedy ids | load at end |",
            "|---|---|---|---|---|---|---|",
        ]
        for dtype, r in out["single"].items():
            lines.append(
                f"| {dtype} (llama.cpp {GGUF[dtype]}) | {r['engine_tok_s']} | {r['llama_server_tok_s']} | "
                f"{r['llama_bench_tok_s']}; {r.get('llama_bench_1_thread_tok_s')} | **{r['ratio']}** | {r['same_ids']}/{len(SINGLE_N)} | "
                f"{r['load'][0]} |"
            )
        lines.append("")
    if out.get("burst"):
        n = out.get("burst_prompt_tokens") or [0]
        lines += [
            f"## Burst: {len(n)} chats on a shared {out.get('burst_shared_tokens')}-token prefix (prompts "
            f"{min(n)}-{max(n)} tokens), {out.get('new_tokens')} new tokens each",
            "",
            "| dtype | engine tok/s | vLLM-CPU tok/s | vLLM one request (serving / offline reference) | "
            "engine / vLLM | TTFT p50 engine / vLLM (s) | same greedy ids | load start -> end |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for dtype, r in out["burst"].items():
            f = lambda x: "-" if x is None else f"{x:.3g}"
            lines.append(
                f"| {dtype} | {f(r['engine'].get('tokens_per_s'))} | {f(r.get('vllm_tok_s'))} | "
                f"{f(r.get('vllm_one_request_tok_s'))} / {f(r.get('vllm_reference_tok_s'))} | "
                f"**{r['ratio']}** | {f(r.get('ttft_p50_engine_s'))} / {f(r.get('ttft_p50_vllm_s'))} | "
                f"{r.get('same_ids', '-')} | {r['load_start'][0]} -> {r['load_end'][0]} |"
            )
            if "error" in r["engine"] or "error" in r.get("vllm", {}):
                lines.append(
                    f"| {dtype} errors | {r['engine'].get('error', '')[:200]} | "
                    f"{r.get('vllm', {}).get('error', '')[:200]} | | | | | |"
                )
        lines.append("")
    b = out.get("busy")
    if b:
        lines += [
            "## One core busy with another process (fp32, 3 prompts)",
            "",
            "| system | tok/s busy | busy / quiet (this run) |",
            "|---|---|---|",
            f"| engine | {b['engine_tok_s']} | {b['engine_busy_over_quiet']} |",
            f"| llama-server F32 | {b['llama_server_tok_s']} | {b['llama_busy_over_quiet']} |",
            "",
        ]
    lines.append(
        f"A ratio is printed only when the peer reached {HANDICAP:.0%} of its own reference in this run "
        "(llama.cpp: llama-bench of the same build and GGUF; vLLM: its offline one-request throughput "
        "against the same request through its server path); otherwise 'peer handicapped'."
    )
    return "\n".join(lines) + "\n"


SINGLE_N = range(6)


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m bench --peers")
    p.add_argument(
        "--llama-dir", default=None, help="llama.cpp's build: llama-server and llama-bench in it"
    )
    p.add_argument(
        "--gguf-dir", default=None, help="the SmolLM2-135M-Instruct-{F32,BF16,Q8_0}.gguf files"
    )
    p.add_argument("--vllm-python", default=None, help="vLLM-CPU's interpreter (its own venv)")
    p.add_argument("--vllm-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--vllm-timeout", type=int, default=2400)
    p.add_argument("--dtypes", default="float32,bfloat16,int8")
    p.add_argument("--burst-dtypes", default="float32,bfloat16")
    p.add_argument("--sections", default="single,burst")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--threads", type=int, default=2, help="llama.cpp's threads (the engine uses the cores)"
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument(
        "--busy", action="store_true", help="also: single stream with one core kept busy"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 prompts, 32 tokens, 4 sessions, 1 round (a smoke run)",
    )
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    a.dtypes = [d for d in a.dtypes.split(",") if d]
    a.burst_dtypes = [d for d in a.burst_dtypes.split(",") if d]
    if a.quick:
        a.new_tokens, a.sessions, a.rounds = 32, 4, 1
    if a.llama_dir and not a.gguf_dir:
        a.gguf_dir = a.llama_dir
    t0 = time.perf_counter()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = len(
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
        ).stdout.splitlines()
    )
    out = {
        "command": "python -m bench --peers " + " ".join(argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": f"{commit} ({dirty} dirty files)",
        "load_start": load(),
        "others_busy": busy_others(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
    }
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        jp = os.path.join(tmp, "prompts.json")
        r = subprocess.run(
            [sys.executable, "-m", "bench.peer_engine", "prepare", jp, str(a.sessions)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        with open(jp) as f:
            job = json.load(f)
        if a.quick:
            job["single"] = job["single"][:2]
        job["new_tokens"] = out["new_tokens"] = a.new_tokens
        out["burst_prompt_tokens"] = [len(p) for p in job["burst"]]
        out["burst_shared_tokens"] = next(
            (
                i
                for i in range(min(map(len, job["burst"])))
                if len({p[i] for p in job["burst"]}) > 1
            ),
            0,
        )
        global SINGLE_N
        SINGLE_N = range(len(job["single"]))
        sections = a.sections.split(",")
        if "single" in sections:
            run_single(a, job, tmp, out)
        if "burst" in sections:
            run_burst(a, job, tmp, out)
        if a.busy:
            run_busy(a, job, tmp, out)
    out["load_end"] = load()
    out["elapsed_s"] = time.perf_counter() - t0
    md = render(out)
    print(md)
    path = a.json or os.path.join(
        REPO, "bench", "results", f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
