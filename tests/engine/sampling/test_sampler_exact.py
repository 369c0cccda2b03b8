"""The batched sampler against a straightforward one-row-at-a-time reference sampler.

The reference (tests/engine/sampling/helpers.py) is the definition: penalties applied element by
element, temperature, a full stable sort of the vocabulary, top-k (ties at the k-th value kept),
top-p over the top-k-renormalised distribution, min-p, then an inverse-CDF draw with one uniform
from the row's generator. The fast sampler must pick the same token for every row; a token that
differs fails the test.
"""

import pytest
import torch

import engine.sampling.sampler as sampler
from engine.sampling.sampler import make_generator, sample, sample_batch
from engine.sampling.sampling_params import SamplingParams
from tests.engine.sampling.helpers import reference_batch


def _random_params(rng: torch.Generator) -> SamplingParams:
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=rng))]
    return SamplingParams(
        temperature=pick([0.0, 0.3, 0.7, 1.0, 1.5]),
        top_k=pick([-1, -1, 1, 5, 40, 300]),
        top_p=pick([1.0, 1.0, 0.5, 0.9, 0.95, 0.999]),
        min_p=pick([0.0, 0.0, 0.05, 0.3]),
        repetition_penalty=pick([1.0, 1.1, 1.5]),
        presence_penalty=pick([0.0, 0.5]),
        frequency_penalty=pick([0.0, 0.3, -0.2]),
    )


def _random_logits(rng, B, V):
    kind = int(torch.randint(4, (1,), generator=rng))
    if kind == 0:  # many exact ties: few distinct values
        return torch.randint(-3, 4, (B, V), generator=rng).float()
    if kind == 1:  # flat: the top-p mass is not covered by the candidates -> exact path
        return torch.randn(B, V, generator=rng) * 0.3
    if kind == 2:  # peaky like a trained LM
        return torch.randn(B, V, generator=rng) * 4.0
    l = torch.randn(B, V, generator=rng) * 2.0
    l[:, :8] = 9.0  # a tie among the top tokens
    return l


def _mismatches_over_random_batches(batches: int, B: int = 64, V: int = 1500) -> list:
    """The sampler against the reference on `batches` random batches (fixed seeds): the rows
    where they pick different tokens."""
    rng = torch.Generator().manual_seed(1234)
    mismatches = []
    for batch in range(batches):
        logits = _random_logits(rng, B, V)
        params = [_random_params(rng) for _ in range(B)]
        plens = [int(torch.randint(0, 20, (1,), generator=rng)) for _ in range(B)]
        histories = [
            torch.randint(
                0, V, (n + int(torch.randint(0, 30, (1,), generator=rng)),), generator=rng
            ).tolist()
            for n in plens
        ]
        seeds = [batch * 1000 + i for i in range(B)]
        got = sample(logits.clone(), params, [make_generator(s) for s in seeds], histories, plens)
        want = reference_batch(logits, params, seeds, histories, plens)
        mismatches += [(batch, i, params[i]) for i in range(B) if got[i] != want[i]]
    return mismatches


def _count_exact_rows(monkeypatch) -> list:
    """Row counts of every call of the full-sort path, as they happen."""
    calls = []
    real_exact = sampler._sample_rows_exact
    monkeypatch.setattr(
        sampler,
        "_sample_rows_exact",
        lambda l, *a: (calls.append(l.shape[0]), real_exact(l, *a))[1],
    )
    return calls


def test_fast_sampler_matches_reference_over_thousands_of_rows(monkeypatch):
    exact_rows = _count_exact_rows(monkeypatch)
    mismatches = _mismatches_over_random_batches(50)  # 3,200 rows, ~4/5 of them sampled
    assert not mismatches, mismatches[:5]
    assert 0 < sum(exact_rows) < 3200 * 4 // 5 // 2  # both paths were exercised


def test_the_gpu_policy_full_sort_in_row_chunks_matches_reference(monkeypatch):
    """What a GPU runs (uses_full_sort): every sampled row through the full sort, in chunks of
    rows; forced here on the CPU. Same reference, same rows as above, chunks of 7 rows."""
    monkeypatch.setattr(sampler, "uses_full_sort", lambda device: True)
    monkeypatch.setattr(sampler, "FULL_SORT_ELEMENTS", 7 * 1500)
    chunks = _count_exact_rows(monkeypatch)
    mismatches = _mismatches_over_random_batches(20)
    assert not mismatches, mismatches[:5]
    sampled = sum(chunks)
    assert max(chunks) == 7 and len(chunks) >= sampled // 7 and sampled > 20 * 64 // 2


def test_the_gpu_policy_needs_few_ops_on_a_flat_row(monkeypatch):
    """Why the GPU takes the full sort: a flat 128k-token row (random weights, or a confused model)
    makes the candidate path retry and fall back, ~300 ops; each is a launch on a GPU. Counted with
    torch's profiler on the CPU (top-level aten calls), not timed."""
    from torch.profiler import ProfilerActivity, profile

    def ops(full_sort: bool) -> int:
        monkeypatch.setattr(sampler, "uses_full_sort", lambda device: full_sort)
        logits = torch.randn(1, 128_256, generator=torch.Generator().manual_seed(0)) * 0.05
        p = [SamplingParams(temperature=0.7, top_p=0.95, seed=1)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sample_batch(logits, p, [make_generator(1)], [list(range(3, 131))])
        return sum(
            1
            for e in prof.events()
            if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        )

    candidates, full = ops(False), ops(True)
    assert full <= 80 and candidates > 3 * full, (candidates, full)  # measured 70 and 304


def test_top_p_one_and_pure_temperature_match_reference():
    rng = torch.Generator().manual_seed(7)
    logits = torch.randn(256, 3000, generator=rng) * 3
    params = [SamplingParams(temperature=1.0, top_p=1.0)] * 256
    seeds = list(range(256))
    got = sample(logits, params, [make_generator(s) for s in seeds], [[]] * 256, [0] * 256)
    assert got == reference_batch(logits, params, seeds, [[]] * 256, [0] * 256)


def test_same_seed_same_tokens_whatever_the_batch():
    rng = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 5000, generator=rng) * 3
    p = SamplingParams(temperature=0.7, top_p=0.95, repetition_penalty=1.1, seed=5)
    alone = [
        sample(logits[i : i + 1], [p], [make_generator(42)], [[1, 2, 3]])[0] for i in range(16)
    ]
    batched = sample(logits, [p] * 16, [make_generator(42) for _ in range(16)], [[1, 2, 3]] * 16)
    assert batched == alone
    other = sample(logits, [p] * 16, [make_generator(43) for _ in range(16)], [[1, 2, 3]] * 16)
    assert other != alone  # the seed matters


def test_logprobs_are_log_softmax_of_raw_logits():
    rng = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 800, generator=rng)
    params = [
        SamplingParams(temperature=0, logprobs=3, repetition_penalty=2.0),
        SamplingParams(temperature=0.8, logprobs=0),
        SamplingParams(temperature=0),
    ]
    out = sample_batch(logits, params, [make_generator(i) for i in range(3)], [[0, 1], [2], []])
    ref = logits.double().log_softmax(-1)
    for i in (0, 1):
        lp = out.logprobs[i]
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(float(ref[i, lp.token_id]), abs=1e-5)
    assert [t for t, _ in out.logprobs[0].top] == ref[0].topk(3).indices.tolist()
    assert out.logprobs[1].top == () and out.logprobs[2] is None


@pytest.mark.parametrize(
    "kw",
    [{"logprobs": 21}, {"logprobs": -1}, {"presence_penalty": 3.0}, {"frequency_penalty": -2.5}],
)
def test_bad_new_params_are_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_wider_candidate_tier_matches_reference(monkeypatch):
    """Rows that 256 candidates cannot decide retry with 4,096 before the full sort."""
    widths = []
    real = sampler._sample_rows
    monkeypatch.setattr(
        sampler, "_sample_rows", lambda l, ps, u, K=256: (widths.append(K), real(l, ps, u, K))[1]
    )
    rng = torch.Generator().manual_seed(11)
    V, B = 20000, 48
    logits = torch.randn(B, V, generator=rng) * torch.linspace(0.8, 3.0, B)[:, None]
    params = [
        SamplingParams(temperature=0.8, top_p=[0.9, 0.5, 1.0][i % 3], min_p=0.0) for i in range(B)
    ]
    seeds = list(range(B))
    got = sample(logits, params, [make_generator(s) for s in seeds], [[]] * B, [0] * B)
    assert got == reference_batch(logits, params, seeds, [[]] * B, [0] * B)
    assert 4096 in widths
