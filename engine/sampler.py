"""Turn a batch of logits into next tokens, each row with its own parameters and generator.

Every sequence owns a torch.Generator, so a seeded request draws the same numbers whatever else
shares its batch. The transformations run batched; only the final draw loops over rows.
"""
from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return g


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[int], penalty: float) -> None:
    """HF/CTRL rule: divide positive logits of seen tokens by the penalty, multiply negative ones."""
    if penalty == 1.0 or not token_ids:
        return
    idx = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
    seen = logits[idx]
    logits[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)


def filter_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks on one row (returns a new tensor)."""
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop tokens once the mass *before* them already reaches top_p (keeps at least one)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
           histories: list[list[int]]) -> list[int]:
    """logits: fp32 [B, vocab] on CPU. histories: prompt+output ids per row (for the penalty)."""
    out: list[int] = []
    greedy_rows = [i for i, p in enumerate(params) if p.greedy and p.repetition_penalty == 1.0]
    argmax = logits.argmax(-1).tolist() if greedy_rows else None
    for i, p in enumerate(params):
        if argmax is not None and p.greedy and p.repetition_penalty == 1.0:
            out.append(argmax[i])
            continue
        row = logits[i].clone()
        apply_repetition_penalty(row, histories[i], p.repetition_penalty)
        if p.greedy:
            out.append(int(row.argmax()))
            continue
        probs = filter_logits(row, p).softmax(-1)
        out.append(int(torch.multinomial(probs, 1, generator=generators[i])))
    return out
