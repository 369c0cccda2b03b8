"""Constrained decoding without the model: the packed bitmask against a dense reference, the
sampler's masked / biased draws against the straightforward definition, spec validation, the
compiler's errors and cache, and a clear refusal when the grammar library is missing."""

import pytest
import torch

from engine.sampling.sampler import make_generator, sample_batch
from engine.sampling.sampling_params import SamplingParams
from engine.sampling.structured import StructuredSpec, StructuredUnavailable
from engine.sampling.structured import compiler as compiler_mod
from engine.sampling.structured.bitmask import allowed_from_bitmask, apply_bitmask_


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """Reference packing, bit by bit: word w bit b <=> token 32 w + b."""
    R, V = allowed.shape
    W = (V + 31) // 32
    out = torch.zeros(R, W, dtype=torch.int64)
    for r in range(R):
        for t in allowed[r].nonzero().flatten().tolist():
            out[r, t // 32] |= 1 << (t % 32)
    out = torch.where(out >= 2**31, out - 2**32, out)  # two's complement into int32
    return out.to(torch.int32)


@pytest.mark.parametrize("V", [64, 100, 1000])
def test_bitmask_unpacks_to_the_dense_reference(V):
    g = torch.Generator().manual_seed(V)
    allowed = torch.rand(5, V, generator=g) < 0.3
    allowed[:, V - 1] = True  # the top bit of the last word
    assert torch.equal(allowed_from_bitmask(_pack(allowed), V), allowed)


def test_apply_bitmask_masks_only_the_listed_rows():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 70, generator=g)
    allowed = torch.rand(2, 70, generator=g) < 0.5
    out = logits.clone()
    apply_bitmask_(out, [1, 3], _pack(allowed))
    for j, r in enumerate([1, 3]):
        ref = logits[r].masked_fill(~allowed[j], float("-inf"))
        assert torch.equal(out[r], ref)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])


def test_a_row_with_nothing_allowed_is_an_error_not_a_nan_draw():
    logits = torch.randn(1, 40)
    with pytest.raises(ValueError, match="allows no token"):
        apply_bitmask_(logits, [0], torch.zeros(1, 2, dtype=torch.int32))


@pytest.mark.parametrize(
    "temperature,top_p,top_k", [(0.0, 1.0, -1), (1.0, 1.0, -1), (0.7, 0.9, -1), (1.3, 1.0, 5)]
)
def test_masked_sampling_draws_only_allowed_tokens_and_greedy_takes_the_best_allowed(
    temperature, top_p, top_k
):
    V = 5000
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, V, generator=g) * 3
    allowed = torch.rand(3, V, generator=g) < 0.01
    params = [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=1)] * 3
    mask = _pack(allowed[[0, 2]])
    for draw in range(30):
        gens = [make_generator(draw * 3 + i) for i in range(3)]
        toks = sample_batch(logits, params, gens, [[], [], []], None, ([0, 2], mask)).token_ids
        assert allowed[0, toks[0]] and allowed[2, toks[2]]
        if temperature == 0:
            assert toks[0] == int(logits[0].masked_fill(~allowed[0], -1e30).argmax())
            assert toks[1] == int(logits[1].argmax())  # the unmasked row is untouched
            break


def test_masked_logprobs_are_those_of_the_raw_logits():
    logits = torch.randn(1, 300)
    allowed = torch.zeros(1, 300, dtype=torch.bool)
    allowed[0, 17] = True
    res = sample_batch(
        logits,
        [SamplingParams(temperature=0, logprobs=0)],
        [make_generator(0)],
        [[]],
        None,
        ([0], _pack(allowed)),
    )
    assert res.token_ids == [17]
    assert res.logprobs[0].logprob == pytest.approx(float(logits[0].log_softmax(-1)[17]), abs=1e-6)


def test_logit_bias_adds_to_the_logits_before_every_rule():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 500, generator=g)
    bias = {11: 100.0, int(logits[0].argmax()): -100.0}
    p = [SamplingParams(temperature=0, logit_bias=bias), SamplingParams(temperature=0)]
    toks = sample_batch(logits, p, [make_generator(0)] * 2, [[], []]).token_ids
    assert toks == [11, int(logits[1].argmax())]
    ref = logits[0].clone()
    ref[int(logits[0].argmax())] -= 100
    p = [SamplingParams(temperature=0, logit_bias={int(logits[0].argmax()): -100.0})]
    assert sample_batch(logits[:1], p, [make_generator(0)], [[]]).token_ids == [int(ref.argmax())]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sample_batch(logits[:1], [SamplingParams(logit_bias={500: 1.0})], [make_generator(0)], [[]])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(kind="yaml"), "kind must be one of"),
        (dict(kind="regex", value=""), "non-empty string"),
        (dict(kind="choice", value=[]), "non-empty list"),
        (dict(kind="choice", value=["a", 3]), "non-empty list"),
        (dict(kind="json_schema", value="{}"), "JSON object"),
        (dict(kind="json_object", trigger=""), "trigger"),
    ],
)
def test_bad_specs_are_refused_up_front(kw, match):
    with pytest.raises(ValueError, match=match):
        StructuredSpec(**kw)


@pytest.mark.parametrize(
    "bad",
    [
        dict(logit_bias={1: 101}),
        dict(logit_bias={-1: 1.0}),
        dict(logit_bias={1: "x"}),
        dict(prompt_logprobs=21),
        dict(structured={"type": "json_object"}),
    ],
)
def test_sampling_params_refuse_bad_shaping_fields(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_closed_objects_forbid_only_unmentioned_extras():
    s = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "c": {"enum": [{"properties": 1}]},
        },
        "$defs": {"D": {"type": "object", "properties": {}, "additionalProperties": True}},
    }
    out = compiler_mod.closed_objects(s)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"] == {"enum": [{"properties": 1}]}  # data, not schema: untouched
    assert out["$defs"]["D"]["additionalProperties"] is True
    assert "additionalProperties" not in s  # the caller's schema is not changed


def test_a_missing_library_refuses_structured_requests_only(monkeypatch):
    monkeypatch.setattr(compiler_mod, "llguidance", None)
    c = compiler_mod.GrammarCompiler(None, 10)
    with pytest.raises(StructuredUnavailable, match="llguidance"):
        c.matcher(StructuredSpec("json_object"))
    assert issubclass(StructuredUnavailable, ValueError)  # a 400 for that request, not a crash
