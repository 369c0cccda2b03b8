"""What constrained decoding costs against free decoding, same engine, same process, interleaved:
python -m bench.structured_cost [--batch 16] [--tokens 48] [--rounds 3] [--dtype float32]

Why: issue 25's target is "constrained decoding (JSON schema) at batch 16 costs <= 15% of decode
throughput", and grammar compile time reported. Both modes run in alternating rounds on one engine
(load changes on a shared box hit both alike). The schema is an array of 40 short strings, long
enough that no constrained row finishes before `--tokens`, so both modes decode full batches; the
free mode is greedy with ignore_eos, the constrained one greedy under the schema. Also reported:
the cold compile of that schema (a fresh compiler) and a cache hit (a repeated schema).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 40,
            "maxItems": 40,
        }
    },
    "required": ["items"],
}


def main(argv=None):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    from engine import LLM, SamplingParams
    from engine.sampling.structured import StructuredSpec
    from engine.sampling.structured.compiler import GrammarCompiler

    llm = LLM(dtype=a.dtype, num_blocks=512)
    spec = StructuredSpec("json_schema", SCHEMA)
    tok = llm.get_tokenizer()
    prompts = [
        {
            "prompt_token_ids": tok.apply_chat_template(
                [{"role": "user", "content": f"List 40 words about topic number {i} as JSON."}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        }
        for i in range(a.batch)
    ]
    fresh = GrammarCompiler(tok, llm.engine.vocab_size)
    fresh.matcher(StructuredSpec("json_object"))  # the tokenizer's one-off set-up, not a compile
    t = time.perf_counter()
    fresh.matcher(spec)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    fresh.matcher(spec)
    hit = time.perf_counter() - t
    modes = {
        "free": SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True),
        "json schema": SamplingParams(temperature=0, max_tokens=a.tokens, structured=spec),
    }
    llm.generate(prompts[:2], modes["json schema"])  # warm-up (and the engine's own compile)
    load = os.getloadavg()[0]
    res = {m: [] for m in modes}
    for _ in range(a.rounds):
        for m, sp in modes.items():
            t = time.perf_counter()
            outs = llm.generate(prompts, sp)
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            res[m].append(n / (time.perf_counter() - t))
    f, c = statistics.median(res["free"]), statistics.median(res["json schema"])
    print(
        f"dtype {llm.config.dtype or 'default'}, batch {a.batch}, {a.tokens} new tokens, "
        f"load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    for m, v in res.items():
        print(f"  {m:12s} median {statistics.median(v):.1f} tok/s  runs {[round(x, 1) for x in v]}")
    print(f"  constrained / free throughput = {c / f:.3f} ({100 * (1 - c / f):.1f}% cost)")
    print(f"  schema compile: cold {cold * 1e3:.2f} ms, cache hit {hit * 1e3:.3f} ms")
    llm.shutdown()


if __name__ == "__main__":
    main()
