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
Each call is timed on its own and the median is reported (microseconds): a call of ~100 us is
rarely preempted even on a loaded machine, where the total of many steps always is; "other" is the
median step minus the parts' medians. The hand-off is the mean time per token as the caller's
iterator receives them (--steps tokens) minus the median step: wall time across two threads, so it
grows with load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PARTS = ("scheduler", "step inputs", "forward stub", "sampler", "detokenizer", "stream")


def _wrap(obj, attr, calls, key):
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            calls[key].append(time.perf_counter() - t0)

    setattr(obj, attr, wrapper)
    return fn


def _stub_forward(model, vocab):
    logits = torch.randn(64, vocab)

    def forward(input_ids, positions, kv_pool, meta, logits_indices, argmax_only=False):
        return logits[: logits_indices.shape[0]]

    model.forward = forward


def measure(steps: int, vocab_model: str = "smollm2-135m") -> dict:
    import engine.core.sample_isolated as isolated  # where the step loop calls the sampler
    import engine.exec.model_runner as mr
    from engine import LLM, SamplingParams
    from engine.text.detokenizer import IncrementalDetokenizer
    from engine.core.sequence import Request

    from engine.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.exec.loader import load_model

    over = {"num_hidden_layers": 1}
    kw = dict(
        num_blocks=256,
        max_model_len=4096,
        device="cpu",
        dtype="float32",
        enable_prefix_caching=False,
    )
    # direct: an LLMEngine with no front thread, stepped in this thread only
    cfg = EngineConfig(model=vocab_model, load_format="dummy", **kw)
    eng = LLMEngine(
        cfg,
        load_model(
            vocab_model,
            load_format="dummy",
            seed=0,
            device="cpu",
            dtype=cfg.torch_dtype,
            hf_overrides=over,
        ),
    )
    vocab = eng.runner.model.embed.shape[0]
    _stub_forward(eng.runner.model, vocab)
    llm = LLM(
        model=vocab_model, load_format="dummy", hf_overrides=over, **kw
    )  # the streaming front
    _stub_forward(llm.engine.runner.model, vocab)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=10**6, ignore_eos=True)
        calls = {k: [] for k in PARTS + ("step total",)}
        originals = [
            (eng.scheduler, "schedule", _wrap(eng.scheduler, "schedule", calls, "scheduler")),
            (
                eng.runner.model,
                "forward",
                _wrap(eng.runner.model, "forward", calls, "forward stub"),
            ),
            (eng, "_emit", _wrap(eng, "_emit", calls, "stream")),
        ]
        orig_pack, orig_sample, orig_add = (
            mr.pack_step,
            isolated.sample_batch,
            IncrementalDetokenizer.add,
        )
        _wrap(mr, "pack_step", calls, "step inputs")
        _wrap(isolated, "sample_batch", calls, "sampler")
        _wrap(IncrementalDetokenizer, "add", calls, "detokenizer")
        try:
            eng.add_request(Request("host-1", list(range(3, 19)), params))
            for _ in range(4):
                eng.step()  # prefill + warm decode steps
            for v in calls.values():
                v.clear()
            for _ in range(steps):
                t0 = time.perf_counter()
                eng.step()
                calls["step total"].append(time.perf_counter() - t0)
            eng.abort_request("host-1")
        finally:
            mr.pack_step, isolated.sample_batch, IncrementalDetokenizer.add = (
                orig_pack,
                orig_sample,
                orig_add,
            )
            for obj, attr, orig in originals:
                setattr(obj, attr, orig)  # the unwrapped callable (the stub for forward)
        direct = {k: statistics.median(v) for k, v in calls.items()}
        direct["other"] = direct["step total"] - sum(direct[k] for k in PARTS)
        # through the LLM front: the gap between consecutive tokens as a caller's iterator sees them
        stream = llm.submit(
            {"prompt_token_ids": list(range(3, 19))},
            SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True),
        )
        stamps = [(time.perf_counter(), len(d.token_ids)) for d in stream if d.token_ids]
        streamed = (stamps[-1][0] - stamps[4][0]) / sum(n for _, n in stamps[5:])
    finally:
        llm.shutdown()
    us = {k: v * 1e6 for k, v in direct.items()}
    us["thread hand-off"] = (streamed - direct["step total"]) * 1e6
    us["streamed per token"] = streamed * 1e6
    return {"us_per_step": us, "steps": steps, "vocab": vocab, "threads": torch.get_num_threads()}


def render(r: dict) -> str:
    lines = [f"| part | us/step (median of {r['steps']} steps, vocab {r['vocab']}) |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in r["us_per_step"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    r = measure(a.steps)
    print(render(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
