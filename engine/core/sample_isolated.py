"""Sample a step's rows so that one row's failure is that row's alone.

Why: one sampler call for the whole batch is the fast path, but a bad row (a grammar with no legal
token, a NaN in one request's logits) must not fail every other request of the step. The engine's
step loop (engine/core/llm_engine.py) calls this for plain and speculative steps alike; what to do
with a failed row (end that request) stays with the loop.
"""

from __future__ import annotations

import torch

from engine.core.sequence import Sequence
from engine.sampling.sampler import sample_batch
from engine.sampling.structured.bitmask import fill_masks


def sample_isolated(
    seqs: list[Sequence], logits: torch.Tensor, vocab_size: int, histories=None
) -> list:
    """Sample the batch in one call; if that raises, retry row by row so only the rows that
    fail get an exception (returned in place of their result) and every other row its
    (token, logprob-or-None).

    Random state is restored before the retry, so a seeded row draws exactly what it would
    have drawn had no other row failed. histories: per row, when not the rows' token lists
    (a speculative sequence has one row per scored position, all with its generator)."""
    params = [s.request.params for s in seqs]
    gens = [s.generator for s in seqs]
    hist = histories if histories is not None else [s.token_ids for s in seqs]
    states = [
        g.get_state() if not p.greedy and (i == 0 or gens[i - 1] is not g) else None
        for i, (p, g) in enumerate(zip(params, gens))
    ]
    masked = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.active]
    mask = None
    try:
        # the grammar rows' bitmasks, filled on the CPU (~0.02 ms a row), applied on the device
        mask = fill_masks([seqs[i].grammar for i in masked], vocab_size) if masked else None
        extra = ((masked, mask),) if masked else ()  # unconstrained batches: the plain call
        res = sample_batch(logits, params, gens, hist, [s.prompt_len for s in seqs], *extra)
        return list(zip(res.token_ids, res.logprobs))
    except Exception:
        pass
    out: list = []
    for i, seq in enumerate(seqs):
        if states[i] is not None:
            gens[i].set_state(states[i])
        try:
            row_mask = None
            if i in masked:
                row_mask = (
                    [0],
                    mask[masked.index(i)][None]
                    if mask is not None
                    else fill_masks([seq.grammar], vocab_size),
                )
            res = sample_batch(
                logits[i : i + 1],
                [params[i]],
                [gens[i]],
                [hist[i]],
                [seq.prompt_len],
                *((row_mask,) if row_mask else ()),
            )
            out.append((res.token_ids[0], res.logprobs[0]))
        except Exception as e:  # noqa: BLE001 - any sampling failure is this row's alone
            out.append(e)
    return out
