"""Prompt token logprobs (what `echo` + `logprobs` on /v1/completions and lm-evaluation-harness's
log-likelihood tasks need): log_softmax of the logits at position p, taken at prompt token p + 1.

Why such a request never takes a prefix-cache hit: a cached position has KV but no logits, so its
logprob would be missing. The engine gives these requests a salt of their own (no hit, and their
blocks cannot be hit by others either), so every prompt position is computed in this request's
prefill chunks, and each chunk asks the model for the logits of all its prompt positions, not
only the last one. The cost is this request's own recompute and one vocab-wide row per prompt
token of its chunk; other requests are untouched.
"""

from __future__ import annotations

import torch

from engine.outputs import TokenLogprob
from engine.step_plan import LogitsRow, StepPlan


class PromptLogprobSalt(str):
    """A per-request cache salt: a str subclass so the KV manager hashes it like any salt."""


def salt_for(request_id: str) -> PromptLogprobSalt:
    return PromptLogprobSalt(f"\x00prompt-logprobs\x00{request_id}")


def positions(plan: StepPlan) -> list[LogitsRow]:
    """The step's prompt-logprob logits rows: every prompt position whose next token is also a
    prompt token, for sequences that asked for prompt logprobs (the scheduler adds them to the
    plan after its sample rows)."""
    out = []
    for r, row in enumerate(plan.rows):
        seq = row.seq
        if seq.request.params.prompt_logprobs is None or seq.index != 0:
            continue
        for p in range(row.start, min(row.end, seq.prompt_len - 1)):
            out.append(LogitsRow(r, p - row.start, "prompt_logprob"))
    return out


@torch.inference_mode()
def record(plan: StepPlan, logits: torch.Tensor) -> None:
    """Store each prompt-logprob row's TokenLogprob on its sequence (`seq.prompt_logprobs[p + 1]`);
    `logits`: one row per `plan.prompt_logprob_rows` entry, in that order."""
    where = [
        (plan.rows[lr.row].seq, plan.rows[lr.row].start + lr.offset)
        for lr in plan.prompt_logprob_rows
    ]
    if not where:
        return
    lp = logits.float().log_softmax(-1)
    targets = torch.tensor([seq.token_ids[p + 1] for seq, p in where], device=lp.device)
    chosen = lp.gather(-1, targets[:, None]).squeeze(-1).tolist()
    kmax = max(seq.request.params.prompt_logprobs for seq, _ in where)
    tv, ti = lp.topk(kmax, -1) if kmax else (lp[:, :0], lp[:, :0].long())
    tv, ti = tv.tolist(), ti.tolist()
    for j, (seq, p) in enumerate(where):
        if seq.prompt_logprobs is None:
            seq.prompt_logprobs = [None] * seq.prompt_len
        k = seq.request.params.prompt_logprobs
        seq.prompt_logprobs[p + 1] = TokenLogprob(
            seq.token_ids[p + 1], chosen[j], tuple(zip(ti[j][:k], tv[j][:k]))
        )
