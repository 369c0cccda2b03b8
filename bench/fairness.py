"""Fair scheduling vs FCFS, one run: `python -m bench --fairness [--quick] [--out FILE.json]`.

Two workloads on the real engine (in process, the same prompts for every policy):

1. flood: one heavy tenant ("batch", an API job at the API's default priority 1) keeps `heavy`
   long requests in flight the whole time, while `chatters` interactive tenants (priority 0, as
   chat turns) each send a message every `period` seconds (64-token replies). Measured: the
   interactive TTFT p50 / p95 (and the same tenants alone, no heavy tenant: the baseline), each
   tenant's share of the tokens generated while the chatters were active, total throughput.
2. backlogged: four tenants with 24 / 12 / 6 / 3 requests always outstanding (more than the slots):
   each tenant's share of the tokens over a window in which all four are backlogged, and Jain's
   fairness index over them ((sum x)^2 / (n sum x^2), 1 = equal shares at equal weights).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

from bench.metrics import percentile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jain(xs: list[float]) -> float | None:
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


class TokenLog:
    """(time, tenant, tokens) for every delta, thread-safe."""

    def __init__(self):
        self.rows: list[tuple[float, str, int]] = []
        self.lock = threading.Lock()

    def add(self, tenant: str, n: int) -> None:
        if n:
            with self.lock:
                self.rows.append((time.perf_counter(), tenant, n))

    def between(self, t0: float, t1: float) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.lock:
            for t, who, n in self.rows:
                if t0 <= t <= t1:
                    out[who] = out.get(who, 0) + n
        return out


def _consume(stream, tenant: str, log: TokenLog):
    """Drain a stream; (ttft seconds from submit, output tokens)."""
    t0 = time.perf_counter()
    first, n = None, 0
    for d in stream:
        if d.token_ids:
            if first is None:
                first = time.perf_counter() - t0
            n += len(d.token_ids)
            log.add(tenant, len(d.token_ids))
    return first, n


def _prompt(tok, k: int, words: int) -> list[int]:
    rng = random.Random(k)
    vocab = [
        "river",
        "bridge",
        "engine",
        "garden",
        "market",
        "winter",
        "signal",
        "harbor",
        "lantern",
        "forest",
    ]
    text = f"Request {k}: " + " ".join(rng.choice(vocab) for _ in range(words))
    return tok.encode(text)


def _heavy_loop(llm, tok, stop: threading.Event, log: TokenLog, idx: int, a) -> None:
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=a.heavy_tokens, ignore_eos=True)
    k = 0
    while not stop.is_set():
        try:
            s = llm.submit(
                {"prompt_token_ids": _prompt(tok, 10_000 + idx * 1000 + k, a.heavy_words)},
                params,
                tenant="batch",
                priority=1,
            )
        except RuntimeError:
            return
        k += 1
        for d in s:
            log.add("batch", len(d.token_ids))
            if stop.is_set():
                s.abort()
                break


def _chatter(llm, tok, i: int, a, log: TokenLog, ttfts: list, start_at: float) -> None:
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=a.chat_tokens, ignore_eos=True)
    time.sleep(max(0.0, start_at - time.perf_counter()) + i * a.period / a.chatters)
    for turn in range(a.turns):
        t_next = time.perf_counter() + a.period
        s = llm.submit(
            {"prompt_token_ids": _prompt(tok, i * 100 + turn, a.chat_words)},
            params,
            tenant=f"chat{i}",
            priority=0,
        )
        ttft, _ = _consume(s, f"chat{i}", log)
        ttfts.append(ttft)
        time.sleep(max(0.0, t_next - time.perf_counter()))


def run_flood(llm, tok, a, with_heavy: bool) -> dict:
    log, ttfts, stop = TokenLog(), [], threading.Event()
    heavy = [
        threading.Thread(target=_heavy_loop, args=(llm, tok, stop, log, j, a), daemon=True)
        for j in range(a.heavy if with_heavy else 0)
    ]
    for t in heavy:
        t.start()
    if with_heavy:  # let the heavy tenant fill every slot and the queue first
        deadline = time.time() + 120
        while llm.load()[0] < llm.config.max_num_seqs and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(a.warmup)
    t0 = time.perf_counter()
    chats = [
        threading.Thread(target=_chatter, args=(llm, tok, i, a, log, ttfts, t0), daemon=True)
        for i in range(a.chatters)
    ]
    for t in chats:
        t.start()
    for t in chats:
        t.join()
    t1 = time.perf_counter()
    stop.set()
    for t in heavy:
        t.join(timeout=120)
    toks = log.between(t0, t1)
    total = sum(toks.values())
    chat_total = sum(v for k, v in toks.items() if k.startswith("chat"))
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "ttft_max_s": max(ttfts),
        "interactive_requests": len(ttfts),
        "window_s": t1 - t0,
        "tokens_per_s": total / (t1 - t0),
        "share_batch": toks.get("batch", 0) / total if total else None,
        "share_interactive": chat_total / total if total else None,
        "tokens_by_tenant": toks,
    }


def run_backlogged(llm, tok, a) -> dict:
    from engine import SamplingParams

    log, stop = TokenLog(), threading.Event()
    params = SamplingParams(temperature=0, max_tokens=a.heavy_tokens, ignore_eos=True)
    tenants = {"t24": 24, "t12": 12, "t6": 6, "t3": 3}
    if a.quick:
        tenants = {"t8": 8, "t4": 4, "t2": 2, "t1": 1}

    def loop(name, j):
        k = 0
        while not stop.is_set():
            s = llm.submit(
                {
                    "prompt_token_ids": _prompt(
                        tok, 50_000 + sum(map(ord, name)) * 100 + j * 10 + k, 40
                    )
                },
                params,
                tenant=name,
                priority=0,
            )
            k += 1
            for d in s:
                log.add(name, len(d.token_ids))
                if stop.is_set():
                    s.abort()
                    break

    threads = [
        threading.Thread(target=loop, args=(n, j), daemon=True)
        for n, c in tenants.items()
        for j in range(c)
    ]
    for t in threads:
        t.start()
    time.sleep(a.warmup)
    t0 = time.perf_counter()
    time.sleep(a.window)
    t1 = time.perf_counter()
    stop.set()
    for t in threads:
        t.join(timeout=120)
    toks = log.between(t0, t1)
    total = sum(toks.values()) or 1
    return {
        "window_s": t1 - t0,
        "tokens_per_s": total / (t1 - t0),
        "shares": {n: toks.get(n, 0) / total for n in tenants},
        "jain": jain([toks.get(n, 0) for n in tenants]),
    }


def run_policy(policy: str, a, baseline: bool) -> dict:
    from engine import ServingLLM

    llm = ServingLLM(
        max_num_seqs=a.max_num_seqs,
        num_blocks=a.num_blocks,
        max_model_len=a.max_model_len,
        dtype=a.dtype,
        scheduling_policy=policy,
    )
    tok = llm.get_tokenizer()
    try:
        out = {"load_start": os.getloadavg()[0]}
        if baseline:
            out["alone"] = run_flood(llm, tok, a, with_heavy=False)
        out["flood"] = run_flood(llm, tok, a, with_heavy=True)
        out["backlogged"] = run_backlogged(llm, tok, a)
        st = llm.stats()
        out["preemptions"] = st["num_preemptions"]
        out["load_end"] = os.getloadavg()[0]
        return out
    finally:
        llm.shutdown()


def render(res: dict) -> str:
    f, c = res["fair"], res["fcfs"]
    base = f.get("alone") or c.get("alone")

    def g(x, fmt="{:.2f}"):
        return "–" if x is None else fmt.format(x)

    rows = [
        (
            "interactive TTFT p50 (s)",
            g(base["ttft_p50_s"]),
            g(c["flood"]["ttft_p50_s"]),
            g(f["flood"]["ttft_p50_s"]),
        ),
        (
            "interactive TTFT p95 (s)",
            g(base["ttft_p95_s"]),
            g(c["flood"]["ttft_p95_s"]),
            g(f["flood"]["ttft_p95_s"]),
        ),
        (
            "interactive TTFT max (s)",
            g(base["ttft_max_s"]),
            g(c["flood"]["ttft_max_s"]),
            g(f["flood"]["ttft_max_s"]),
        ),
        (
            "token share: heavy tenant",
            "–",
            g(c["flood"]["share_batch"], "{:.0%}"),
            g(f["flood"]["share_batch"], "{:.0%}"),
        ),
        (
            "token share: 8 interactive",
            g(base["share_interactive"], "{:.0%}"),
            g(c["flood"]["share_interactive"], "{:.0%}"),
            g(f["flood"]["share_interactive"], "{:.0%}"),
        ),
        (
            "throughput, flood (tok/s)",
            g(base["tokens_per_s"], "{:.0f}"),
            g(c["flood"]["tokens_per_s"], "{:.0f}"),
            g(f["flood"]["tokens_per_s"], "{:.0f}"),
        ),
        (
            "backlogged: shares " + "/".join(c["backlogged"]["shares"]),
            "–",
            " / ".join(f"{v:.0%}" for v in c["backlogged"]["shares"].values()),
            " / ".join(f"{v:.0%}" for v in f["backlogged"]["shares"].values()),
        ),
        (
            "backlogged: Jain's index",
            "–",
            g(c["backlogged"]["jain"], "{:.3f}"),
            g(f["backlogged"]["jain"], "{:.3f}"),
        ),
        (
            "throughput, backlogged (tok/s)",
            "–",
            g(c["backlogged"]["tokens_per_s"], "{:.0f}"),
            g(f["backlogged"]["tokens_per_s"], "{:.0f}"),
        ),
        ("preemptions (whole run)", "–", str(c["preemptions"]), str(f["preemptions"])),
    ]
    lines = ["| metric | interactive alone | FCFS | fair |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {x} | {y} |" for a, b, x, y in rows]
    r = res["ratios"]
    lines.append("")
    lines.append(
        f"fair / alone TTFT p95: {g(r['fair_p95_over_alone'])}x; FCFS / alone: {g(r['fcfs_p95_over_alone'])}x; "
        f"fair / FCFS throughput (flood): {g(r['throughput_flood_fair_over_fcfs'])}x, "
        f"(backlogged): {g(r['throughput_backlogged_fair_over_fcfs'])}x"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench --fairness")
    p.add_argument("--heavy", type=int, default=48, help="heavy tenant's requests kept in flight")
    p.add_argument("--heavy-tokens", type=int, default=256)
    p.add_argument("--heavy-words", type=int, default=150)
    p.add_argument("--chatters", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument(
        "--period", type=float, default=4.0, help="seconds between one chatter's messages"
    )
    p.add_argument("--chat-tokens", type=int, default=64)
    p.add_argument("--chat-words", type=int, default=40)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument(
        "--window", type=float, default=30.0, help="backlogged workload's measuring window (s)"
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.heavy, a.heavy_tokens, a.heavy_words, a.chatters, a.turns, a.period = 6, 24, 20, 2, 1, 1.0
        a.chat_tokens, a.max_num_seqs, a.warmup, a.window, a.num_blocks = 8, 4, 0.5, 2.0, 512
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from bench.machine import git_commit

    res = {
        "command": "python -m bench --fairness "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(REPO),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": vars(a),
    }
    res["fcfs"] = run_policy("fcfs", a, baseline=False)
    res["fair"] = run_policy("fair", a, baseline=True)
    base = res["fair"]["alone"]

    def ratio(x, y):
        return x / y if x and y else None

    res["ratios"] = {
        "fair_p95_over_alone": ratio(res["fair"]["flood"]["ttft_p95_s"], base["ttft_p95_s"]),
        "fcfs_p95_over_alone": ratio(res["fcfs"]["flood"]["ttft_p95_s"], base["ttft_p95_s"]),
        "throughput_flood_fair_over_fcfs": ratio(
            res["fair"]["flood"]["tokens_per_s"], res["fcfs"]["flood"]["tokens_per_s"]
        ),
        "throughput_backlogged_fair_over_fcfs": ratio(
            res["fair"]["backlogged"]["tokens_per_s"], res["fcfs"]["backlogged"]["tokens_per_s"]
        ),
    }
    md = render(res)
    print(md)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
            f.write(f"`{res['command']}` at {res['commit']}, started {res['started']}\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
