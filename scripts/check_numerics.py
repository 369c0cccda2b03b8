"""GPU check stage: the whole engine vs HF transformers on the same random weights.

For one shipped config (fewer layers, full width and vocabulary) and one dtype, the engine serves a
workload that covers what can break numerically: prompt lengths around block edges up to 1,500,
chunked prefill (a small token budget), a shared prefix (prefix-cache hit), and an n=2 fork
(copy-on-write of a partial block) — with decode steps batched (CUDA graphs when on). Every logits
row the engine samples from is recorded; afterwards HF's forward over the final token sequences
(teacher forcing) gives the reference row for each.
Rules (issue #16): fp32: max |logit diff| < 2e-3 and the same argmax at every step;
bf16/fp16: the engine's max error against HF fp32 <= 2x HF's own error in that dtype.
"""

from __future__ import annotations

import time

import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw

BLOCK = 16


def workload(vocab: int, max_len: int, smoke: bool) -> list[tuple[list[int], SamplingParams]]:
    g = torch.Generator().manual_seed(7)
    rnd = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()
    lengths = (
        [1, 15, 16, 17, 40] if smoke else [1, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1023, 1500]
    )
    lengths = [n for n in lengths if n + 8 < max_len]
    greedy = SamplingParams(temperature=0, max_tokens=3 if smoke else 6, ignore_eos=True)
    items = [(rnd(n), greedy) for n in lengths]
    shared = rnd(2 * BLOCK + 5)
    items += [(shared + rnd(9), greedy), (shared + rnd(21), greedy)]  # prefix hit
    fork = SamplingParams(
        n=2, temperature=1.0, seed=3, max_tokens=4 if smoke else 8, ignore_eos=True
    )
    items += [(rnd(BLOCK + 7), fork)]  # CoW of a partial block
    return items


class Recorder:
    """Wraps the runner: keeps (sequence, context length, logits row) for every sampled row."""

    def __init__(self, runner):
        self.rows: list[tuple[object, int, torch.Tensor]] = []
        self._inner = runner.run_on_device

        def run_on_device(plan):
            plan.argmax_only = False  # this check compares every logit (kernels/greedy_head.py)
            logits = self._inner(plan)
            for i, lr in enumerate(plan.sampled):
                row = plan.rows[lr.row]
                self.rows.append((row.seq, row.start + lr.offset + 1, logits[i].float().cpu()))
            return logits

        runner.run_on_device = run_on_device


def hf_rows(hf, tokens: list[int], lengths: list[int], device) -> torch.Tensor:
    """HF logits predicting token L for each context length L (teacher forcing on `tokens`)."""
    ids = torch.tensor([tokens[: max(lengths)]], device=device)
    with torch.no_grad():
        hidden = hf.model(input_ids=ids).last_hidden_state[0]
        idx = torch.tensor([L - 1 for L in lengths], device=device)
        return hf.lm_head(hidden[idx]).float().cpu()


def check_config(
    name: str,
    dtype: str,
    device: str,
    layers: int,
    smoke: bool,
    overrides=None,
    kv_cache_dtype: str = "auto",
) -> dict:
    """kv_cache_dtype int8 / fp8: the same workload on a quantized pool (the kvquant stage reports
    its error beside the unquantized pool's; the dtype rules below are for unquantized pools)."""
    t0 = time.perf_counter()
    over = {"num_hidden_layers": layers, **(overrides or {})}
    cfg = dw.load_config(name, over)
    max_len = 2048
    budget = 64 if smoke else 512  # forces chunked prefill of long prompts
    llm = LLM(
        model=name,
        load_format="dummy",
        hf_overrides=over,
        device=device,
        dtype=dtype,
        seed=11,
        num_blocks=(256 if smoke else 2048),
        max_model_len=max_len,
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        kv_cache_dtype=kv_cache_dtype,
    )
    try:
        rec = Recorder(llm.engine.runner)
        items = workload(cfg.vocab_size, max_len, smoke)
        half = len(items) - 3
        llm.generate(
            [{"prompt_token_ids": p} for p, _ in items[:half]], [s for _, s in items[:half]]
        )
        # second wave: the shared-prefix pair arrives after the first of them is cached
        llm.generate([{"prompt_token_ids": items[half][0]}], [items[half][1]])
        llm.generate(
            [{"prompt_token_ids": p} for p, _ in items[half + 1 :]],
            [s for _, s in items[half + 1 :]],
        )
        stats = llm.stats()
        graphs = llm.engine.runner.graphs is not None
    finally:
        llm.shutdown()
    by_seq: dict[int, tuple[object, list]] = {}
    for seq, L, row in rec.rows:
        by_seq.setdefault(id(seq), (seq, []))[1].append((L, row))
    w32 = dw.random_weights(cfg, seed=11, device=device, dtype=torch.float32)
    ref32 = dw.hf_model_with_weights(cfg, w32, torch.float32, device)
    tdt = getattr(torch, dtype)
    ref_lp = None if tdt == torch.float32 else dw.hf_model_with_weights(cfg, w32, tdt, device)
    err, err_hf, argmax_same, rows, argmax_rows = 0.0, 0.0, True, 0, 0
    for seq, entries in by_seq.values():
        lengths = [L for L, _ in entries]
        ours = torch.stack([r for _, r in entries])
        ref = hf_rows(ref32, seq.token_ids, lengths, device)
        err = max(err, (ours - ref).abs().max().item())
        same = ours.argmax(-1) == ref.argmax(-1)
        argmax_same &= bool(same.all())
        argmax_rows += int(same.sum())
        if ref_lp is not None:
            err_hf = max(
                err_hf, (hf_rows(ref_lp, seq.token_ids, lengths, device) - ref).abs().max().item()
            )
        rows += len(entries)
    if tdt == torch.float32:
        ok = err < 2e-3 and argmax_same
        rule = "max|diff| < 2e-3 and same argmax"
    else:
        ok = err <= 2 * err_hf
        rule = f"engine err <= 2 x HF-{dtype} err ({err_hf:.3g})"
    return {
        "config": name,
        "layers": layers,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "ok": ok,
        "rule": rule,
        "argmax_agreement": argmax_rows / max(rows, 1),
        "max_abs_err_vs_hf_fp32": err,
        "hf_lowp_err_vs_fp32": err_hf if ref_lp is not None else None,
        "same_argmax": argmax_same,
        "rows_compared": rows,
        "sequences": len(by_seq),
        "prefix_cache_hits_tokens": stats.get("prefix_cache_hits"),
        "cuda_graphs": graphs,
        "seconds": time.perf_counter() - t0,
    }
