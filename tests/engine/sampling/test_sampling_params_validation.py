"""Issue #12 item 1: every sampling value is finite and in range, or the request is refused up front.

NaN passed the old checks (`nan < 0` is False) and a temperature of 1e-40 overflowed logits / T,
so both reached torch.multinomial inside the shared engine step.
"""

import math

import pytest

from engine.sampling.sampling_params import MIN_TEMPERATURE, SamplingParams

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", NAN),
        ("temperature", INF),
        ("temperature", -INF),
        ("temperature", 1e-40),
        ("temperature", MIN_TEMPERATURE / 2),
        ("temperature", -0.5),
        ("temperature", 1e6),
        ("temperature", "0.7"),
        ("temperature", True),
        ("top_p", NAN),
        ("top_p", INF),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", NAN),
        ("min_p", -0.1),
        ("min_p", 2.0),
        ("repetition_penalty", NAN),
        ("repetition_penalty", INF),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", 1e9),
        ("top_k", 0),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_k", NAN),
        ("n", 0),
        ("n", True),
        ("n", 1.0),
        ("n", 129),
        ("stop", ["x"] * 65),
        ("stop", ["y" * 1001]),
        ("stop", 5),
        ("stop", [1]),
        ("stop_token_ids", 7),
        ("max_tokens", 0),
        ("max_tokens", INF),
        ("max_tokens", 3.0),
        ("seed", 1.5),
        ("seed", True),
        ("seed", "7"),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [True]),
    ],
)
def test_bad_value_is_refused_with_a_clear_error(field, value):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert field in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0},
        {"temperature": 0.0},
        {"temperature": MIN_TEMPERATURE},
        {"temperature": 2.0},
        {"top_p": 1.0, "top_k": -1, "min_p": 0.0},
        {"top_p": 1e-3, "top_k": 1, "min_p": 1.0},
        {"repetition_penalty": 0.8},
        {"repetition_penalty": 100.0},
        {"seed": -1},
        {"seed": 2**70},
        {"n": 128},
    ],
)
def test_good_values_are_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(p, name) == value
    assert all(
        math.isfinite(getattr(p, n))
        for n in ("temperature", "top_p", "min_p", "repetition_penalty")
    )


def test_temperature_zero_is_greedy_and_the_minimum_is_not():
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy


def test_only_a_plain_greedy_row_lets_the_step_screen_its_lm_head():
    """engine/sampling/sampler.argmax_suffices: anything that reads more than the argmax keeps the
    whole LM head (kernels/greedy_head.py)."""
    from engine.sampling.sampler import argmax_suffices
    from engine.sampling.structured.spec import StructuredSpec

    assert argmax_suffices(SamplingParams(temperature=0, max_tokens=5, stop=["x"], n=2))
    for extra in (
        {"temperature": 0.7},
        {"logprobs": 0},
        {"logit_bias": {3: 1.0}},
        {"repetition_penalty": 1.1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"structured": StructuredSpec("json_object")},
    ):
        kw = {"temperature": 0, **extra}
        assert not argmax_suffices(SamplingParams(**kw)), extra
