"""The pieces of speculative decoding without a model: the n-gram proposer, the suffix history,
the step-cost fit and the rule that picks a draft length (engine/sampling/speculative/)."""

import random

from engine.sampling.speculative.adaptive import Acceptance, StepCost, draft_length
from engine.sampling.speculative.ngram import NgramIndex, SuffixHistory


def _brute_force(toks, k, min_n=2, max_n=4):
    """The definition: longest n-gram ending the list that occurred before; its latest occurrence."""
    L = len(toks)
    for n in range(max_n, min_n - 1, -1):
        if L < n:
            continue
        tail = toks[L - n :]
        for end in range(L - 1, n - 1, -1):  # occurrence toks[end-n:end], continuation at end
            if toks[end - n : end] == tail and end <= L - 1:
                return toks[end : end + k]
    return []


def test_incremental_index_matches_the_definition():
    rng = random.Random(0)
    for trial in range(200):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        idx = NgramIndex()
        for cut in sorted({rng.randrange(1, len(toks) + 1) for _ in range(3)} | {len(toks)}):
            assert idx.propose(toks[:cut], 5) == _brute_force(toks[:cut], 5), (trial, toks[:cut])


def test_proposer_continues_a_repeated_span():
    text = [5, 6, 7, 8, 9, 10, 11, 1, 2, 5, 6, 7]
    assert NgramIndex().propose(text, 4) == [8, 9, 10, 11]
    assert NgramIndex().propose([1, 2, 3], 4) == []


def test_suffix_history_is_per_tenant_and_draft_length_follows_the_match():
    h = SuffixHistory()
    h.add("alice", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert h.propose("bob", [3, 4, 5], 8) == []  # another tenant's reply is never drafted
    assert h.propose("alice", [3, 4, 5], 8) == [6, 7, 8, 9]  # 3 tokens matched: up to 4 drafted
    assert h.propose("alice", [4, 5], 8) == [6, 7, 8]  # 2 matched: up to 3
    h.forget("alice")
    assert h.propose("alice", [3, 4, 5], 8) == []


def test_step_cost_recovers_a_linear_cost():
    c = StepCost()
    rng = random.Random(1)
    for _ in range(200):
        t = rng.randrange(1, 40)
        c.observe(t, 0.040 + 0.003 * t)
    a, b = c.fit()
    assert abs(a - 0.040) < 2e-3 and abs(b - 0.003) < 2e-4


def test_step_cost_without_variation_uses_the_prior_slope():
    c = StepCost()
    for _ in range(20):
        c.observe(1, 0.045)
    a, b = c.fit()
    assert 0 < b < 0.045 and abs(a + b - 0.045) < 1e-9


def test_draft_length_pays_at_batch_one_and_switches_off_for_big_batches():
    a, b = 0.042, 0.0011  # fitted on this CPU (fp32): a step is mostly per-step overhead
    assert draft_length(0.8, a, b, 1, 1, 5) == 5
    assert draft_length(0.3, a, b, 1, 1, 5) >= 1
    assert draft_length(0.03, a, b, 1, 1, 5) == 0  # drafts nearly always wrong
    assert draft_length(0.7, a, b, 32, 32, 5) == 0  # 2 x b x R = 0.070/0.077 = 0.91 > p
    assert draft_length(0.97, a, b, 16, 16, 5) >= 1  # nearly always right: still pays
    assert draft_length(0.99, a, 0.0, 32, 32, 5) == 0  # above MAX_BATCH nobody drafts
    assert draft_length(0.8, a, 0.0, 8, 8, 5) == 5  # free tokens (a GPU at small batch)
    assert draft_length(0.8, a, b, 1, 1, 0) == 0


def test_acceptance_learns_from_verifications_and_shadows():
    acc = Acceptance()
    for _ in range(30):
        acc.verified(4, 0)
    assert acc.p < 0.1
    for _ in range(30):
        acc.shadow(True)
    assert acc.p > 0.9
    assert acc.drafted == 120 and acc.accepted == 0 and acc.verify_steps == 30
