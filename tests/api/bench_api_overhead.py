"""API-path overhead against LLM.generate: the same 16 greedy chat requests, 16 at once, same engine.

    python -m tests.api.bench_api_overhead [--streams 16] [--max-tokens 64] [--rounds 3]

Run as a script (not collected by pytest). The server (uvicorn + engine) runs in this process like
app.py; the 16 streaming clients (official `openai` AsyncOpenAI) run in a child process, so client
work does not share this process's GIL. Prefix caching is off so every run prefills the same amount;
ignore_eos fixes every reply at max_tokens. Rounds alternate generate / API; medians are reported.

TTFT: generate's from the engine (arrival -> first token); the API's from the client (request sent ->
first content chunk), so it includes HTTP, JSON and SSE. Throughput: all generated tokens / wall time
of the whole batch (for the API: first request sent -> last stream closed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SYSTEM = "You are a helpful assistant who answers in detail."
CLIENT = r'''
import asyncio, json, sys, time
import openai
url, model, n, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
msgs = json.loads(sys.stdin.read())
async def one(c, m):
    t0 = time.perf_counter(); first = None; toks = 0
    s = await c.chat.completions.create(model=model, messages=m, temperature=0, max_tokens=max_tokens,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True})
    async for ch in s:
        if ch.choices and ch.choices[0].delta.content and first is None:
            first = time.perf_counter()
        if ch.usage:
            toks = ch.usage.completion_tokens
    end = time.perf_counter()
    return {"ttft": first - t0, "tokens": toks, "start": t0, "end": end, "decode_tps": (toks - 1) / (end - first)}
async def main():
    c = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
    rs = await asyncio.gather(*(one(c, m) for m in msgs))
    print(json.dumps(rs))
asyncio.run(main())
'''


def messages(n: int) -> list[list[dict]]:
    topics = [
        "rivers",
        "volcanoes",
        "bread",
        "trains",
        "owls",
        "glaciers",
        "chess",
        "tea",
        "bridges",
        "bees",
        "comets",
        "maps",
        "violins",
        "deserts",
        "lighthouses",
        "coral",
        "kites",
        "salt",
        "clocks",
        "ferns",
    ]
    return [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me about {topics[i % len(topics)]} (request {i})."},
        ]
        for i in range(n)
    ]


def run_generate(llm, msgs, max_tokens):
    from engine import SamplingParams
    from engine.text.session_prompt import continue_session_prompt

    prompts = [
        {"prompt_token_ids": continue_session_prompt(llm.get_tokenizer(), m, None)} for m in msgs
    ]
    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, p)
    wall = time.perf_counter() - t0
    ms = [o.outputs[0].metrics for o in outs]
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "ttft": statistics.median(m["ttft_s"] for m in ms),
        "tps": toks / wall,
        "decode_tps": statistics.median(m["tokens_per_s"] for m in ms),
    }


def run_api(url, model, msgs, max_tokens):
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, url, model, str(len(msgs)), str(max_tokens)],
        input=json.dumps(msgs),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        raise RuntimeError(out.stderr)
    rs = json.loads(out.stdout)
    wall = max(r["end"] for r in rs) - min(r["start"] for r in rs)
    return {
        "ttft": statistics.median(r["ttft"] for r in rs),
        "tps": sum(r["tokens"] for r in rs) / wall,
        "decode_tps": statistics.median(r["decode_tps"] for r in rs),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import tests.conftest  # noqa: F401  (same environment settings as the tests)
    from engine import ServingLLM
    from tests.api.conftest import LiveServer, build_server_app

    llm = ServingLLM(
        num_blocks=1024, max_model_len=1024, max_num_seqs=64, enable_prefix_caching=False
    )
    srv = LiveServer(build_server_app(llm))
    try:
        model = json.loads(
            __import__("urllib.request").request.urlopen(srv.url + "v1/models").read()
        )["data"][0]["id"]
        msgs = messages(a.streams)
        run_generate(llm, msgs[:2], 4)  # warm-up both paths
        run_api(srv.url + "v1", model, msgs[:2], 4)
        gen, api = [], []
        for _ in range(a.rounds):
            gen.append(run_generate(llm, msgs, a.max_tokens))
            api.append(run_api(srv.url + "v1", model, msgs, a.max_tokens))
        med = {
            k: {key: statistics.median(r[key] for r in rs) for key in ("ttft", "tps", "decode_tps")}
            for k, rs in (("generate", gen), ("api", api))
        }
        print(
            json.dumps(
                {
                    "streams": a.streams,
                    "max_tokens": a.max_tokens,
                    "rounds": a.rounds,
                    "generate": gen,
                    "api": api,
                    "median": med,
                    "ratio_api_over_generate": {
                        "ttft": med["api"]["ttft"] / med["generate"]["ttft"],
                        "tps": med["api"]["tps"] / med["generate"]["tps"],
                        "decode_tps": med["api"]["decode_tps"] / med["generate"]["decode_tps"],
                    },
                },
                indent=1,
            )
        )
    finally:
        srv.stop()
        llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
