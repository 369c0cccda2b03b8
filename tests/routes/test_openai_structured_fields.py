"""OpenAI / vLLM request fields -> the engine's StructuredSpec and logit bias, without a model:
each accepted form maps to the right spec, malformed or ambiguous ones are a 400 naming the field."""

import pytest

from engine.sampling.structured import StructuredSpec
from routes.openai.errors import APIError
from routes.openai.schemas import ChatCompletionRequest, CompletionRequest
from routes.openai.structured import logit_bias, structured_spec

MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _chat(**kw):
    return ChatCompletionRequest(model="m", messages=MSG, **kw)


@pytest.mark.parametrize(
    "kw,spec",
    [
        ({}, None),
        (dict(response_format={"type": "text"}), None),
        (dict(response_format={"type": "json_object"}), StructuredSpec("json_object")),
        (
            dict(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            ),
            StructuredSpec("json_schema", SCHEMA),
        ),
        (dict(structured_outputs={"regex": "a+"}), StructuredSpec("regex", "a+")),
        (dict(structured_outputs={"choice": ["x", "y"]}), StructuredSpec("choice", ["x", "y"])),
        (dict(structured_outputs={"json": SCHEMA}), StructuredSpec("json_schema", SCHEMA)),
        (
            dict(structured_outputs={"grammar": 'start: "a"'}),
            StructuredSpec("grammar", 'start: "a"'),
        ),
        (dict(structured_outputs={"json_object": True}), StructuredSpec("json_object")),
        (dict(guided_regex="b+"), StructuredSpec("regex", "b+")),
        (dict(guided_choice=["p"]), StructuredSpec("choice", ["p"])),
    ],
)
def test_accepted_forms_map_to_one_spec(kw, spec):
    assert structured_spec(_chat(**kw)) == spec


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(response_format={"type": "yaml"}), "response_format"),
        (dict(response_format={"type": "json_schema", "json_schema": "x"}), "response_format"),
        (dict(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs"),
        (dict(structured_outputs={"choice": []}), "structured_outputs"),
        (dict(response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    ],
)
def test_malformed_or_ambiguous_constraints_are_400(kw, param):
    with pytest.raises(APIError) as e:
        structured_spec(_chat(**kw))
    assert e.value.status == 400 and e.value.body()["error"]["param"] == param


def test_logit_bias_keys_become_token_ids():
    assert logit_bias(_chat(logit_bias={"5": 2.5, "7": -100})) == {5: 2.5, 7: -100.0}
    assert logit_bias(_chat()) is None
    for bad in ({"x": 1}, {"-1": 1}, {"3": 101}):
        with pytest.raises(APIError):
            logit_bias(_chat(logit_bias=bad))


def test_completion_echo_and_max_tokens_zero_rules():
    CompletionRequest(model="m", prompt="x", echo=True, max_tokens=0, logprobs=1)
    with pytest.raises(ValueError, match="max_tokens"):
        CompletionRequest(model="m", prompt="x", max_tokens=0)
    with pytest.raises(ValueError, match="fill-in-the-middle"):
        CompletionRequest(model="m", prompt="x", suffix="y")
