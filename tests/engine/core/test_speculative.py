"""Speculative decoding (engine/core/speculation.py): the real model, speculation on vs off.

Greedy with drafts must be token-identical to greedy without them (and so to HF): alone, batched
with prefix hits, under preemption, with stop strings. Sampling with drafts must draw from the same
distribution (a two-sample chi-square over many draws, with a power check that the same statistic
does tell two nearby temperatures apart). `speculative_adaptive=False` makes every decoding step
draft whatever the proposer finds, so the verification path is exercised on every step.
"""

import pytest

from engine import SamplingParams

CODE = '''def merge(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out
'''
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the lens and wrote the weather in a small leather book. Ships passed far out at sea, "
    "and none of them ever knew his name, but each of them found the harbour by his light."
)
CHATS = [
    [
        {
            "role": "user",
            "content": f"Rename the function merge to merge_sorted and show the whole code:\n```python\n{CODE}```",
        }
    ],
    [{"role": "user", "content": f"Rewrite this text in the present tense:\n\n{TEXT}"}],
    [{"role": "user", "content": "Which three rivers flow through Paris, Lyon and Bordeaux?"}],
    [
        {"role": "system", "content": "You answer in one short paragraph."},
        {"role": "user", "content": f"Summarize: {TEXT}"},
    ],
]


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_greedy_with_drafts_equals_greedy_without_and_hf(make_llm, hf_greedy):
    params = SamplingParams(temperature=0, max_tokens=48)
    from ui.dashboard.events import diff_events

    on = make_llm(speculative="ngram", speculative_adaptive=False)
    before = on.snapshot()
    outs = [on.chat(c, params)[0] for c in CHATS[:2]]  # one at a time: batch 1
    feed = diff_events(before, on.snapshot())  # the Memory tab's "what just happened"
    assert any(x.startswith("speculative decoding: ") and "rolled back" in x for x in feed), feed
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 48, draft=out.outputs[0].token_ids
        )
    s = on.stats()
    assert s["spec_accepted_tokens"] > 20 and s["spec_draft_tokens"] > s["spec_accepted_tokens"], s
    assert s["spec_rolled_back_slots"] == s["spec_draft_tokens"] - s["spec_accepted_tokens"]
    m = outs[0].outputs[0].metrics
    assert (
        m["spec_accepted_tokens"] > 0 and m["decode_steps"] < len(outs[0].outputs[0].token_ids) - 1
    )


def test_eight_concurrent_with_prefix_hits_preemption_and_stop_strings(make_llm):
    """8 requests at once in a pool too small for them all (preemption), sharing a system prompt
    (prefix hits), two with stop strings: speculation on and off give the same tokens."""
    chats = [CHATS[i % 4] for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 6 + [
        SamplingParams(temperature=0, max_tokens=40, stop=["Lille River", "keeper"]),
        SamplingParams(temperature=0, max_tokens=40, stop=[" the"], logprobs=2),
    ]
    got = {}
    for spec in (None, "ngram"):
        llm = make_llm(speculative=spec, speculative_adaptive=False, num_blocks=28, max_num_seqs=8)
        llm.chat(CHATS[3], SamplingParams(temperature=0, max_tokens=4))  # warms the system prompt
        outs = llm.chat(chats, params)
        got[spec] = outs
        s = llm.stats()
        assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0, s
        assert s["used_blocks"] == 0, s
    assert _tokens(got["ngram"]) == _tokens(got[None])
    assert [o.outputs[0].text for o in got["ngram"]] == [o.outputs[0].text for o in got[None]]
    assert [o.outputs[0].finish_reason for o in got["ngram"]][-2:] == ["stop", "stop"]
    a, b = got["ngram"][-1].outputs[0].logprobs, got[None][-1].outputs[0].logprobs
    assert [x.logprob for x in a] == pytest.approx([x.logprob for x in b], abs=1e-3)


def test_seeded_sampling_draws_the_same_with_drafts(make_llm):
    """One uniform per emitted token, from the request's generator, on or off: same tokens."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, repetition_penalty=1.1, max_tokens=40, seed=s)
        for s in range(4)
    ]
    got = {}
    for spec in (None, "ngram"):
        llm = make_llm(speculative=spec, speculative_adaptive=False)
        got[spec] = _tokens(llm.chat([CHATS[0]] * 4, params))
        if spec:
            assert llm.stats()["spec_accepted_tokens"] > 0
    assert got["ngram"] == got[None]


def _chi_square(a: list, b: list, top: int = 5) -> float:
    """Two-sample chi-square over the `top` commonest categories + "other" (df = top)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    cats = [c for c, _ in (ca + cb).most_common(top)]
    rows = [(ca[c], cb[c]) for c in cats] + [
        (len(a) - sum(ca[c] for c in cats), len(b) - sum(cb[c] for c in cats))
    ]
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in rows:
        tot = x + y
        if tot == 0:
            continue
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return stat


CHI2_DF5_P001 = 20.515  # chi-square critical value, 5 degrees of freedom, p = 0.001


def _draft_hits(prompt: list[int], out: list[int]) -> int:
    """How many of a reply's tokens the n-gram proposer would have guessed: the statistic a
    wrong acceptance rule moves first (accepting too many drafts raises it, too few lowers it)."""
    from engine.sampling.speculative.ngram import NgramIndex

    idx, toks, hits = NgramIndex(), list(prompt), 0
    for t in out:
        hits += idx.propose(toks, 1) == [t]
        toks.append(t)
    return hits


@pytest.mark.slow
def test_sampling_distribution_is_unchanged_by_drafts(make_llm):
    """Sampling with drafts verified on every step vs without, 160 unseeded draws each of a prompt
    whose reply tends to repeat it (so drafts are found, and often rejected): the distribution of
    the draft-hit count and of the 6th-7th tokens agree (chi-square, p = 0.001), while the same
    statistics do tell temperature 0.8 from 0.5 apart at this sample size (the test's power)."""
    chat = [
        {"role": "user", "content": "Repeat exactly: red green blue red green blue red green blue"}
    ]
    N = 160

    def draws(llm, temperature):
        p = SamplingParams(temperature=temperature, top_k=8, max_tokens=8, ignore_eos=True)
        outs = llm.chat([chat] * N, p)
        return (
            [_draft_hits(o.prompt_token_ids, o.outputs[0].token_ids) for o in outs],
            [tuple(o.outputs[0].token_ids[5:7]) for o in outs],
        )

    off = make_llm(max_num_seqs=N, seed=1)
    on = make_llm(speculative="ngram", speculative_adaptive=False, max_num_seqs=N, seed=2)
    (ha, ta), (hb, tb) = draws(off, 0.8), draws(on, 0.8)
    s = on.stats()
    assert (
        s["spec_accepted_tokens"] > N // 2 and s["spec_draft_tokens"] > s["spec_accepted_tokens"]
    ), s
    assert _chi_square(ha, hb) < CHI2_DF5_P001
    assert _chi_square(ta, tb) < CHI2_DF5_P001
    hc, tc = draws(off, 0.5)
    assert _chi_square(ha, hc) > CHI2_DF5_P001 and _chi_square(ta, tc) > CHI2_DF5_P001


def test_opt_outs_still_work(make_llm):
    """n > 1, structured outputs and speculative=False never draft; they run as before."""
    from engine.sampling.structured.spec import StructuredSpec

    llm = make_llm(speculative="ngram", speculative_adaptive=False)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    base = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=24, speculative=False))[0]
    assert llm.stats()["spec_draft_tokens"] == 0
    assert llm.chat(CHATS[0], greedy)[0].outputs[0].token_ids == base.outputs[0].token_ids
    drafted = llm.stats()["spec_draft_tokens"]
    assert drafted > 0
    two = llm.chat(CHATS[0], SamplingParams(temperature=0.7, max_tokens=12, n=2, seed=3))[0]
    assert len(two.outputs) == 2
    js = llm.chat(
        [{"role": "user", "content": "Give a JSON object with a key a."}],
        SamplingParams(temperature=0, max_tokens=24, structured=StructuredSpec("json_object")),
    )[0]
    assert js.outputs[0].text.strip().startswith("{")
    assert llm.stats()["spec_draft_tokens"] == drafted


def test_acceptance_rule_with_the_real_sampler_preserves_the_distribution():
    """No model: known logits, a fixed draft, 20,000 draws through sample_batch and the engine's
    acceptance rule. The first emitted token must follow p0 (goodness of fit), and after an
    accepted draft the next one p1, whatever the draft; a rule that kept a wrong draft fails."""
    import torch
    from engine.core.speculation import accepted_prefix
    from engine.sampling.sampler import make_generator, sample_batch

    N, V = 20000, 6
    p0 = torch.tensor([0.05, 0.1, 0.15, 0.2, 0.25, 0.25])
    p1 = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.05, 0.05])
    params = [SamplingParams(temperature=1.0)] * (2 * N)
    gens = [make_generator(i) for i in range(N)]
    logits = torch.cat([p0.log().expand(N, V), p1.log().expand(N, V)])
    # one generator per draw, its two positions in order (as the engine's k + 1 rows)
    order = [g for g in gens] + [g for g in gens]
    toks = sample_batch(logits, params, order, [[]] * (2 * N)).token_ids
    for draft in (3, 0):  # a likely and an unlikely draft
        first, second = [], []
        for i in range(N):
            sampled = [toks[i], toks[N + i]]
            a = accepted_prefix([draft], sampled)
            emitted = [draft] * a + [sampled[a]]  # what Speculator.accept appends
            first.append(emitted[0])
            if a:
                second.append(emitted[1])
        for got, p in ((first, p0), (second, p1)):
            counts = torch.bincount(torch.tensor(got), minlength=V).double()
            expect = p.double() * len(got)
            chi = float(((counts - expect) ** 2 / expect).sum())
            assert chi < CHI2_DF5_P001, (draft, counts, expect)


def test_a_failing_proposer_or_verifier_costs_only_drafts_or_that_request(make_llm, monkeypatch):
    """Fault injection into the real engine: drafting that raises leaves plain steps (every reply
    still right); a verification that raises ends its own request only, blocks freed."""
    from engine.core import speculation

    params = SamplingParams(temperature=0, max_tokens=24)
    llm = make_llm(speculative="ngram", speculative_adaptive=False)
    want = [o.outputs[0].token_ids for o in llm.chat(CHATS[:2], params)]

    def broken(*a, **k):
        raise RuntimeError("proposer bug")

    monkeypatch.setattr(speculation.NgramIndex, "propose", broken)
    assert [o.outputs[0].token_ids for o in llm.chat(CHATS[:2], params)] == want
    monkeypatch.undo()

    calls = {"n": 0}
    real_accept = speculation.Speculator.accept

    def accept_once_broken(self, seq, *a):
        calls["n"] += 1
        if seq.request.prompt_ids == outs_ids[0] and calls["n"] > 1:
            raise RuntimeError("verifier bug")
        return real_accept(self, seq, *a)

    from engine.text.session_prompt import continue_session_prompt

    outs_ids = [continue_session_prompt(llm.get_tokenizer(), CHATS[0], None)]
    monkeypatch.setattr(speculation.Speculator, "accept", accept_once_broken)
    streams = [
        llm.submit({"prompt_token_ids": ids}, params)
        for ids in outs_ids + [continue_session_prompt(llm.get_tokenizer(), CHATS[1], None)]
    ]
    finals = []
    for s in streams:
        deltas = list(s)
        finals.append(([t for d in deltas for t in d.token_ids], deltas[-1]))
    assert finals[0][1].finish_reason == "error" and "verifier bug" in finals[0][1].error
    assert finals[1][1].error is None and finals[1][0] == want[1]
    assert llm.stats()["used_blocks"] == 0
