"""Decode speed per KV cache format on the CPU, with and without the lean step, side by side.

    python -m bench.kv_decode_speed [--rounds 2] [--tokens 96] [--batches 1,8]

Why: an int8 pool used to send every step to the per-layer loop (the lean step read only pools in
the weights' dtype), so int8 KV decoded several times slower than fp32 KV; the lean step now reads
and writes int8 rows. Each configuration is a fresh `LLM` on the default model (fp32 weights):
fp32 KV, int8 KV on the loop (`lean_step="off"`: what int8 ran on before) and int8 KV on the lean
step, in turn, `--rounds` times, so a slow spell of the machine hits all three. For each batch
size: 8 different prompts (the first `batch` of them), `--tokens` greedy tokens each, ignoring EOS,
best of two; tok/s = batch x tokens / wall time (prefill included, as a chat sees it).
"""

from __future__ import annotations

import argparse
import time

CONFIGS = (("float32", "auto"), ("int8", "off"), ("int8", "auto"))
PROMPTS = [
    f"Write a short story, number {i}, about a lighthouse keeper and a cat." for i in range(8)
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args(argv)
    from engine import LLM
    from engine.exec.loader import resolve_hf_folder
    from engine.sampling.sampling_params import SamplingParams

    folder = resolve_hf_folder(None)[1]
    batches = [int(b) for b in args.batches.split(",")]
    sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    print("| round | KV cache | step | " + " | ".join(f"batch {b} (tok/s)" for b in batches) + " |")
    print("|---|---|---|" + "---|" * len(batches))
    for rnd in range(args.rounds):
        for kv, lean in CONFIGS:
            llm = LLM(folder, dtype="float32", kv_cache_dtype=kv, lean_step=lean)
            try:
                llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
                rates = []
                for b in batches:
                    best = 0.0
                    for _ in range(2):
                        t = time.perf_counter()
                        llm.generate(PROMPTS[:b], sp)
                        best = max(best, b * args.tokens / (time.perf_counter() - t))
                    rates.append(best)
            finally:
                llm.shutdown()
            step = "lean" if lean != "off" else "loop"
            print(
                f"| {rnd} | {kv} | {step} | " + " | ".join(f"{r:.1f}" for r in rates) + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
