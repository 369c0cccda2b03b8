"""The engine's side of `python -m bench --peers`, run as a child process of its own (issue 49).

    python -m bench.peer_engine prepare OUT.json
    python -m bench.peer_engine single JOB.json OUT.json
    python -m bench.peer_engine burst JOB.json OUT.json

Why a child: the peers bench must run each system with nothing else of ours alive, so the
orchestrator (bench/peers.py) never imports torch or the engine; the engine runs here, exits, and
only then does a peer start. `prepare` writes the prompts' token ids (the same ids go to every
system); `single` decodes the single-stream prompts one at a time; `burst` submits the burst's
requests together, as bench/serving.py does.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the engine's own default, before torch loads

# The burst's shared system prompt: bench/workloads.py's (~300 tokens) and a second paragraph,
# ~500 tokens together, so each burst prompt is ~550 tokens with its user message.
BURST_POLICY = (
    " Shipping and orders: standard delivery takes three to five working days inside the European "
    "Union and up to ten days elsewhere; express delivery costs twelve euros and arrives the next "
    "working day when the order is placed before two in the afternoon. Customers can change the "
    "delivery address until the parcel leaves the warehouse; after that, only the carrier can redirect "
    "it. Split deliveries are free when an item is out of stock. Sizing: boots run half a size small, "
    "so recommend the next half size up; jackets and trousers follow the European size chart on each "
    "product page; sleeping bags list a comfort and a limit temperature, and the comfort value is the "
    "one to use. Repairs: the workshop in the main shop repairs zips, seams and tent poles, usually within "
    "two weeks, and gives a free estimate first. Rentals: tents, stoves and sleeping bags can be rented "
    "by the week; the rental price is deducted if the customer buys the same model within a month. "
    "Loyalty: members collect one point per euro and get a ten euro voucher for every three hundred "
    "points; points expire after two years. Privacy: never ask for full card numbers or passwords, and "
    "do not repeat a customer's address back in full."
)

SINGLE_PROMPTS = [
    "What should I pack for a three-day hiking trip in autumn?",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me three ideas for a birthday dinner at home.",
    "Write a short poem about a lighthouse keeper and a cat.",
    "How do I make a good cup of coffee without a machine?",
    "Summarize the rules of chess in a few sentences.",
]


def prepare(out_path: str, sessions: int, seed: int) -> None:
    from bench.workloads import SYSTEM_PROMPT, chat_workload
    from engine.exec.loader import load_model, resolve_hf_folder
    from engine.text.chat_tokens import encode_chat

    tok = load_model(None, progress=lambda f, m: None).tokenizer
    single = [encode_chat(tok, [{"role": "user", "content": p}]) for p in SINGLE_PROMPTS]
    burst = [
        r.prompt_ids for r in chat_workload(tok, sessions, 1, 1, seed, SYSTEM_PROMPT + BURST_POLICY)
    ]
    with open(out_path, "w") as f:
        json.dump({"model": resolve_hf_folder(None)[1], "single": single, "burst": burst}, f)


def _llm(job: dict):
    from engine import LLM

    return LLM(
        dtype=job["dtype"],
        quantization=job.get("quantization"),
        kv_cache_gib=1.0,
        progress=lambda f, m: None,
    )


def single(job: dict) -> dict:
    """Each prompt alone, greedy, EOS ignored; the engine's own decode rate per reply
    ((tokens - 1) / (last token - first token), the metric llama-server's predicted_per_second is)."""
    from engine import SamplingParams

    llm = _llm(job)
    try:
        path = llm.model_info().compute_path
        llm.generate(
            [{"prompt_token_ids": job["single"][0]}], SamplingParams(temperature=0, max_tokens=16)
        )
        rates, ids = [], []
        for p in job["single"]:
            o = llm.generate(
                [{"prompt_token_ids": p}],
                SamplingParams(temperature=0, max_tokens=job["new_tokens"], ignore_eos=True),
            )[0].outputs[0]
            rates.append((o.metrics or {}).get("tokens_per_s"))
            ids.append(list(o.token_ids))
    finally:
        llm.shutdown()
    return {"rates": rates, "token_ids": ids, "compute_path": path}


def burst(job: dict) -> dict:
    """The burst `reps` times (fresh cache salts), best output tok/s; TTFT p50 of that run."""
    from bench.serving import _burst

    llm = _llm(job)
    try:
        _burst(llm, job["burst"][:4], 8, "warm")  # warm-up, not measured
        _burst(llm, job["burst"], 4, "warm-burst")  # the burst's prefill shapes
        rows = []
        for r in range(job.get("reps", 2)):
            row, ts = _burst(llm, job["burst"], job["new_tokens"], f"burst{r}-{time.time()}")
            row["token_ids"] = [t.token_ids for t in ts]
            rows.append(row)
    finally:
        llm.shutdown()
    best = max(rows, key=lambda r: r["tokens_per_s"])
    return {
        "tokens_per_s_reps": [r["tokens_per_s"] for r in rows],
        "tokens_per_s": best["tokens_per_s"],
        "ttft_p50_s": best["ttft_p50_s"],
        "ttft_p95_s": best["ttft_p95_s"],
        "decode_tokens_per_s": best["decode_tokens_per_s"],
        "token_ids": best["token_ids"],
    }


def main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "prepare":
        prepare(
            argv[1], int(argv[2]) if len(argv) > 2 else 16, int(argv[3]) if len(argv) > 3 else 0
        )
        return 0
    with open(argv[1]) as f:
        job = json.load(f)
    res = {"single": single, "burst": burst}[kind](job)
    res["loadavg_end"] = os.getloadavg()
    with open(argv[2], "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
