"""Batch-1 host overhead per decode step, with the model stubbed: python -m bench.host_overhead

Why: at batch 1 on a GPU a decode step's device time is short (a 1B bf16 model reads 2.5 GB:
~0.6 ms on an H200), so every microsecond of serialized host work is throughput lost; the GPU
review estimated ~0.25 ms of it. The device is not needed to measure the host side: the model's
forward is replaced by a function returning a preallocated logits row (no compute), and each part
of LLMEngine.step is timed by wrappers on this process's objects:
  scheduler      Scheduler.schedule
  step inputs    pack_step (the staging buffer fill + upload of one eager step)
  forward stub   the stubbed model forward (the cost of the call itself)
  sampler        sample_batch (greedy argmax over the vocabulary, token ids to Python)
  detokenizer    IncrementalDetokenizer.add
  stream         LLMEngine._emit (building and delivering the delta)
  other          step wall minus the above (bookkeeping, stop checks)
  thread hand-off  per token, streaming through the LLM front (engine thread -> caller's
                 iterator) minus the direct step time
Reported in microseconds per step (median of --rounds rounds of --steps steps), same process.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PARTS = ("scheduler", "step inputs", "forward stub", "sampler", "detokenizer", "stream")


def _wrap(obj, attr, bucket, key):
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            bucket[key] += time.perf_counter() - t0
    setattr(obj, attr, wrapper)
    return fn


def _stub_forward(model, vocab):
    logits = torch.randn(64, vocab)

    def forward(input_ids, positions, kv_pool, meta, logits_indices):
        return logits[:logits_indices.shape[0]]
    model.forward = forward


def measure(steps: int, rounds: int, vocab_model: str = "smollm2-135m") -> dict:
    import engine.llm_engine as le
    import engine.model_runner as mr
    from engine import LLM, SamplingParams
    from engine.detokenizer import IncrementalDetokenizer
    from engine.sequence import Request

    llm = LLM(model=vocab_model, load_format="dummy", hf_overrides={"num_hidden_layers": 1}, device="cpu",
              dtype="float32", num_blocks=256, max_model_len=4096, enable_prefix_caching=False)
    try:
        eng = llm.engine
        vocab = eng.runner.model.embed.shape[0]
        _stub_forward(eng.runner.model, vocab)
        params = SamplingParams(temperature=0.0, max_tokens=10**6, ignore_eos=True)
        # direct: drive LLMEngine.step() in this thread (the engine thread is idle: no request there)
        b = dict.fromkeys(PARTS, 0.0)
        originals = [(eng.scheduler, "schedule", _wrap(eng.scheduler, "schedule", b, "scheduler")),
                     (eng.runner.model, "forward", _wrap(eng.runner.model, "forward", b, "forward stub")),
                     (eng, "_emit", _wrap(eng, "_emit", b, "stream"))]
        orig_pack, orig_sample, orig_add = mr.pack_step, le.sample_batch, IncrementalDetokenizer.add
        _wrap(mr, "pack_step", b, "step inputs")
        _wrap(le, "sample_batch", b, "sampler")
        _wrap(IncrementalDetokenizer, "add", b, "detokenizer")
        rows = []
        try:
            req = Request("host-1", list(range(3, 19)), params)
            eng.add_request(req)
            for _ in range(4):
                eng.step()                                   # prefill + warm decode steps
            for _ in range(rounds):
                for k in b:
                    b[k] = 0.0
                t0 = time.perf_counter()
                for _ in range(steps):
                    eng.step()
                wall = (time.perf_counter() - t0) / steps
                row = {k: v / steps for k, v in b.items()}
                row["other"] = wall - sum(row.values())
                row["step wall"] = wall
                rows.append(row)
            eng.abort_request("host-1")
        finally:
            mr.pack_step, le.sample_batch, IncrementalDetokenizer.add = orig_pack, orig_sample, orig_add
            for obj, attr, _ in originals:
                if attr in vars(obj):
                    delattr(obj, attr)                   # drop the instance wrapper
        direct = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        # through the LLM front: tokens as a caller's iterator sees them
        walls = []
        for _ in range(rounds):
            stream = llm.submit({"prompt_token_ids": list(range(3, 19))},
                                SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True))
            n, t0 = 0, None
            for delta in stream:
                n += len(delta.token_ids) if hasattr(delta, "token_ids") else 1
                if n == 4 and t0 is None:
                    t0, n0 = time.perf_counter(), n
            walls.append((time.perf_counter() - t0) / (n - n0))
        streamed = statistics.median(walls)
    finally:
        llm.shutdown()
    us = {k: v * 1e6 for k, v in direct.items()}
    us["thread hand-off"] = (streamed - direct["step wall"]) * 1e6
    us["streamed per token"] = streamed * 1e6
    return {"us_per_step": us, "steps": steps, "rounds": rounds, "vocab": vocab, "threads": torch.get_num_threads()}


def render(r: dict) -> str:
    lines = [f"| part | us/step (median of {r['rounds']} x {r['steps']} steps, vocab {r['vocab']}) |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in r["us_per_step"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    r = measure(a.steps, a.rounds)
    print(render(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
