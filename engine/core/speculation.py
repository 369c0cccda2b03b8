"""Speculative decoding on paged KV: draft before the schedule, verify after the forward.

The cycle of one decoding sequence, when `--speculative ngram|suffix` is on:

1. `propose` (before the schedule): the proposer guesses the next k tokens from the conversation
   (engine/sampling/speculative/ngram.py) and the adaptive rule picks k, 0 when a draft would not
   pay (engine/sampling/speculative/adaptive.py). The guesses go to `seq.draft`, never into
   `seq.token_ids`: the token list stays what the model really produced, so the KV manager never
   hashes a draft into the prefix cache.
2. The scheduler gives the sequence 1 + k slots (its last real token and the drafts) when the pool
   and the token budget allow, else it schedules the plain one-token step (scheduler.py).
3. The forward scores all k + 1 positions (a multi-token query over the paged context: the kernels'
   chunked-prefill path), and every position is sampled with the ordinary sampler, position j with
   the history token_ids + draft[:j] (penalties see what they would have seen).
4. `accept` keeps draft tokens while they equal what was sampled at their position and adds the
   first sampled token that differs (or the bonus token after a fully accepted draft). For greedy
   that is exactly the non-speculative output. For sampling it is rejection sampling with a
   deterministic draft: accepting d with probability p(d) and otherwise drawing from p without d is
   the same as drawing x ~ p and accepting iff x == d, so every emitted token is distributed as p.
   Each position draws one uniform from the request's own generator; the generator is rewound to
   just after the emitted tokens' draws, so a seeded request draws the same uniforms with
   speculation on or off (its output differs only where batched scoring changes a logit's last bits).
5. The KV of rejected positions is rolled back: `KVCacheManager.rollback` frees their slots.

Not speculated (opt-out, documented): n > 1, beam search and other driven requests, structured
outputs (the grammar would have to advance through drafts), `SamplingParams(speculative=False)`.
"""

from __future__ import annotations

import time

import torch

from engine.sampling.speculative.adaptive import Acceptance, StepCost, draft_length
from engine.sampling.speculative.ngram import NgramIndex, SuffixHistory

SUFFIX_PROMPT_TAIL = 512  # prompt tokens kept with a finished reply in the suffix history


def accepted_prefix(draft: list[int], sampled: list[int]) -> int:
    """How many draft tokens stand: while the token sampled at a draft's position (from the
    target distribution given everything before it) equals the draft, the draft is accepted.
    With a deterministic draft this is exact rejection sampling (see the module docstring)."""
    a = 0
    while a < len(draft) and sampled[a] == draft[a]:
        a += 1
    return a


class SpecState:
    """One sequence's speculation: its n-gram index, acceptance, and a pending shadow check."""

    __slots__ = ("index", "acceptance", "shadow", "steps")

    def __init__(self):
        self.index = NgramIndex()
        self.acceptance = Acceptance()
        self.shadow: tuple[int, int] | None = None  # (position, token) guessed but not verified
        self.steps = 0  # steps that gave this sequence tokens


class Speculator:
    def __init__(self, mode: str, max_k: int, adaptive: bool = True):
        self.mode, self.max_k, self.adaptive = mode, max_k, adaptive
        self.cost = StepCost()
        self.history = SuffixHistory() if mode == "suffix" else None
        self.num_drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos = [0] * max_k
        self._t0 = 0.0
        self._decode_tokens = 0

    # ---- before the schedule ----------------------------------------------------------------
    def eligible(self, seq, engine) -> bool:
        p = seq.request.params
        return (
            p.speculative
            and p.n == 1
            and seq.grammar is None
            and p.structured is None
            and seq.request.request_id not in engine.drivers
        )

    def propose(self, running: list, engine) -> None:
        """Set seq.draft for every decoding sequence of `running` (cleared for the others)."""
        decoding = []
        for seq in running:
            seq.draft = []
            if (
                engine.kv.has_sequence(seq.seq_id)
                and engine.kv.num_computed(seq.seq_id) == len(seq.token_ids) - 1
                and self.eligible(seq, engine)
            ):
                decoding.append(seq)
        if not decoding:
            return
        B = len(running)
        a, b = self.cost.fit() if self.cost.ready else (1.0, 0.1)  # the prior until fitted
        for seq in decoding:
            st = seq.spec
            if st is None:
                st = seq.spec = SpecState()
            toks = seq.token_ids
            if st.shadow is not None and len(toks) > st.shadow[0]:
                st.acceptance.shadow(toks[st.shadow[0]] == st.shadow[1])
                st.shadow = None
            p = seq.request.params
            room = min(
                self.max_k, engine.max_model_len - len(toks), p.max_tokens - len(seq.output_ids) - 1
            )
            k = (
                0
                if room <= 0
                else draft_length(st.acceptance.p, a, b, B, B, room)
                if self.adaptive
                else room
            )
            draft = st.index.propose(toks, max(k, 1))
            if not draft and self.history is not None:
                draft = self.history.propose(seq.request.tenant, toks[-st.index.max_n :], max(k, 1))
            if k > 0:
                seq.draft = draft[:k]
            elif draft:
                st.shadow = (len(toks), draft[0])

    # ---- around the forward -----------------------------------------------------------------
    def step_started(self, plan) -> None:
        """Remember whether this step (a StepPlan) is pure decode (only those fit the step cost)."""
        self._t0 = time.perf_counter()
        decode = all(row.start == len(row.seq.token_ids) - 1 for row in plan.rows)
        self._decode_tokens = plan.num_tokens if decode else 0

    def step_finished(self) -> None:
        if self._decode_tokens:
            self.cost.observe(self._decode_tokens, time.perf_counter() - self._t0)

    @staticmethod
    def histories(seq, k: int) -> list[list[int]]:
        """What each of the k + 1 scored positions has seen (for penalties)."""
        toks = seq.token_ids
        return [toks] + [toks + seq.draft[:j] for j in range(1, k + 1)]

    # ---- after sampling ---------------------------------------------------------------------
    def accept(self, seq, results: list, gen_state, kv) -> list:
        """results: (token, logprob) of the k + 1 positions. Returns what to append (accepted
        drafts + one sampled token); rolls the rejected slots back and rewinds the generator."""
        draft = seq.draft
        k = len(draft)
        a = accepted_prefix(draft, [t for t, _ in results])
        kv.rollback(seq.seq_id, len(seq.token_ids) + a)
        if gen_state is not None:  # one uniform per emitted token, as without drafts
            seq.generator.set_state(gen_state)
            for _ in range(a + 1):
                torch.rand(1, generator=seq.generator)
        st = seq.spec
        st.acceptance.verified(k, a)
        self.num_drafts += 1
        self.draft_tokens += k
        self.accepted_tokens += a
        for j in range(a):
            self.accepted_per_pos[j] += 1
        seq.draft = []
        # the accepted drafts are what the KV holds at their positions, then the first sample past them
        return [(draft[j], results[j][1]) for j in range(a)] + [results[a]]

    def finished(self, seq) -> None:
        """A finished reply joins its tenant's suffix history (suffix mode)."""
        if self.history is not None and seq.spec is not None:
            start = max(0, seq.prompt_len - SUFFIX_PROMPT_TAIL)
            self.history.add(seq.request.tenant, seq.token_ids[start:])

    def metrics(self, seq) -> dict:
        """The per-reply numbers the chat line shows ("17 accepted from drafts, 2.1 tokens/step")."""
        st = seq.spec
        if st is None:
            return {"spec_accepted_tokens": 0, "spec_draft_tokens": 0, "decode_steps": 0}
        return {
            "spec_accepted_tokens": st.acceptance.accepted,
            "spec_draft_tokens": st.acceptance.drafted,
            "decode_steps": st.steps,
        }
