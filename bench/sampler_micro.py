"""Sampling cost alone at the real vocabulary: python -m bench.sampler_micro [--batch 32]

Times engine.sampling.sampler.sample_batch on [batch, 49,152] fp32 logits of the real model at the end of
the chat workload's prompts, greedy vs the app's default sampling (temperature 0.7,
top-p 0.95, repetition penalty 1.1 over the prompts), and the old per-row full-sort
method for comparison. Interleaved rounds, medians: the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.sampling.sampler import make_generator, sample_batch
from engine.sampling.sampling_params import SamplingParams


def old_full_sort(logits, p, histories):
    """The previous sampler's per-row path (full sort per row for top-p), kept here as a yardstick."""
    out = []
    for i in range(logits.shape[0]):
        row = logits[i].clone()
        idx = torch.tensor(sorted(set(histories[i])))
        seen = row[idx]
        row[idx] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        row = row / p.temperature
        s, order = torch.sort(row, descending=True)
        probs = s.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        out.append(int(torch.multinomial(row.softmax(-1), 1)))
    return out


def real_logits(B: int):
    """Next-token logits of the default model (HF forward) at the end of B chat prompts, with
    each prompt as the row's history: what the sampler really sees."""
    from transformers import AutoModelForCausalLM
    from bench.workloads import chat_workload
    from engine.exec.loader import load_model

    loaded = load_model(None, progress=lambda f, m: None)
    hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=torch.float32)
    reqs = chat_workload(loaded.tokenizer, B, 1, 1, seed=0)
    rows = []
    with torch.inference_mode():
        for r in reqs:
            rows.append(hf(torch.tensor([r.prompt_ids])).logits[0, -1])
    return torch.stack(rows), [r.prompt_ids for r in reqs]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args(argv)
    B, V = a.batch, 49152
    logits, hist = real_logits(B)
    app = SamplingParams(temperature=0.7, top_p=0.95, repetition_penalty=1.1)
    greedy = SamplingParams(temperature=0.0)
    gens = [make_generator(i) for i in range(B)]
    cases = {
        "greedy": lambda: sample_batch(logits, [greedy] * B, gens, hist),
        "app default": lambda: sample_batch(logits, [app] * B, gens, hist),
        "old full sort (app default)": lambda: old_full_sort(logits, app, hist),
    }
    times = {k: [] for k in cases}
    with torch.inference_mode():
        for _ in range(a.rounds):
            for k, fn in cases.items():
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
    print(f"batch {B} x vocab {V}, {torch.get_num_threads()} threads, median of {a.rounds}")
    for k, v in times.items():
        print(f"  {k:30s} {statistics.median(v) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
