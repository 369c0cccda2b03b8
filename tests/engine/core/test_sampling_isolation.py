"""Issue #12 item 1: a failure while sampling one request fails only that request.

The sampler is the real one; a fault is injected into one row by wrapping it, the way a bug or a
poisoned value in one request would surface. The other requests must finish exactly like HF greedy,
the failing one must end with an error, and no block may leak.
"""

import pytest

import engine.core.sample_isolated as sampling_module  # where the step loop calls the sampler
from engine import SamplingParams

PROMPTS = ["The capital of France is", "One, two, three, four,", "def add(a, b):", "Water boils at"]


def _poison_one_row(monkeypatch, poisoned: SamplingParams, after_tokens: int):
    real_sample = sampling_module.sample_batch
    calls = {"batched_failures": 0}

    def sample_batch(logits, params, generators, histories, prompt_lens=None):
        for p, h in zip(params, histories):
            if p is poisoned and len(h) >= after_tokens:
                if len(params) > 1:
                    calls["batched_failures"] += 1
                raise RuntimeError("injected sampling fault")
        return real_sample(logits, params, generators, histories, prompt_lens)

    monkeypatch.setattr(sampling_module, "sample_batch", sample_batch)
    return calls


@pytest.mark.parametrize("fail_at_first_token", [True, False])
def test_one_failing_row_fails_only_its_request(
    make_llm, hf_greedy, monkeypatch, fail_at_first_token
):
    llm = make_llm(num_blocks=128)
    tok = llm.get_tokenizer()
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    bad = SamplingParams(temperature=0.8, seed=3, max_tokens=10)
    bad_ids = ids[1]
    calls = _poison_one_row(monkeypatch, bad, len(bad_ids) + (0 if fail_at_first_token else 3))
    good = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    streams = [
        llm.submit({"prompt_token_ids": i}, good if k != 1 else bad) for k, i in enumerate(ids)
    ]
    results = []
    for s in streams:
        deltas = list(s)
        results.append(([t for d in deltas for t in d.token_ids], deltas[-1]))
    assert calls["batched_failures"] >= 1, "the fault must hit a batched call (other rows in it)"
    for k, (toks, last) in enumerate(results):
        if k == 1:
            assert last.finish_reason == "error" and "injected sampling fault" in last.error
            assert len(toks) == (0 if fail_at_first_token else 3)
        else:
            assert last.error is None and last.finish_reason == "length"
            assert toks == hf_greedy(ids[k], 10, stop_at_eos=False, draft=toks)
    assert llm.stats()["used_blocks"] == 0


def test_seeded_neighbour_draws_the_same_despite_a_failing_row(make_llm, monkeypatch):
    llm = make_llm(num_blocks=128)
    tok = llm.get_tokenizer()
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:2]]
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    alone = [t for d in llm.submit({"prompt_token_ids": ids[0]}, seeded) for t in d.token_ids]
    bad = SamplingParams(temperature=1.0, seed=5, max_tokens=8)
    _poison_one_row(monkeypatch, bad, len(ids[1]) + 2)
    s_ok = llm.submit({"prompt_token_ids": ids[0]}, seeded)
    s_bad = llm.submit({"prompt_token_ids": ids[1]}, bad)
    assert [t for d in s_ok for t in d.token_ids] == alone
    assert list(s_bad)[-1].finish_reason == "error"


def test_a_failing_child_of_n_ends_its_request_only(make_llm, hf_greedy, monkeypatch):
    llm = make_llm(num_blocks=128)
    tok = llm.get_tokenizer()
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:2]]
    bad = SamplingParams(n=3, temperature=0.7, seed=1, max_tokens=6)
    _poison_one_row(monkeypatch, bad, len(ids[1]) + 2)
    good = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    s_ok = llm.submit({"prompt_token_ids": ids[0]}, good)
    s_bad = llm.submit({"prompt_token_ids": ids[1]}, bad)
    got = [t for d in s_ok for t in d.token_ids]
    assert got == hf_greedy(ids[0], 6, stop_at_eos=False, draft=got)
    finals = [d for d in s_bad if d.finished]
    assert sorted(d.index for d in finals) == [0, 1, 2]
    assert all(d.finish_reason == "error" for d in finals)
    assert llm.stats()["used_blocks"] == 0
