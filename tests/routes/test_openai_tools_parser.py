"""The tool-call format's pieces without a model: the streaming parser gives the same content and
calls however the text is split, holds back a partial marker, and the plan's grammar compiles and
accepts exactly the documented call text (checked with the real grammar library)."""

import json

import pytest

from routes.openai.tools import ToolCallParser, ToolPlan, stream_delta

TEXT = (
    'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "x": {"a": [1, "}"]}}}'
    '</tool_call>\n<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 11, 10_000])
def test_parser_result_does_not_depend_on_how_the_text_streams(step):
    p = ToolCallParser()
    events = []
    for i in range(0, len(TEXT), step):
        events += p.feed(TEXT[i : i + step])
    events += p.finish()
    f = p.message_fields()
    assert f["content"] == "Let me check."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in f["tool_calls"]
    ] == [("get_weather", {"city": "Paris", "x": {"a": [1, "}"]}}), ("noop", {})]
    # the stream's deltas add up to the same message
    assert "".join(e[1] for e in events if e[0] == "content") == "Let me check. "
    args = {}
    for e in events:
        if e[0] == "args":
            args[e[1]] = args.get(e[1], "") + e[2]
    assert [json.loads(args[i]) for i in range(2)] == [{"city": "Paris", "x": {"a": [1, "}"]}}, {}]


def test_a_partial_marker_is_held_back_and_plain_text_passes():
    p = ToolCallParser()
    assert p.feed("Hello <tool") == [("content", "Hello ")]
    assert p.feed("box>") == [("content", "<toolbox>")]
    assert p.finish() == [] and p.message_fields() == {"content": "Hello <toolbox>"}


def test_stream_deltas_have_openais_shape():
    assert stream_delta(("call", 0, "call_x", "f")) == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_x",
                "type": "function",
                "function": {"name": "f", "arguments": ""},
            }
        ]
    }
    assert stream_delta(("args", 1, '{"a"')) == {
        "tool_calls": [{"index": 1, "function": {"arguments": '{"a"'}}]
    }


def _tools():
    return [
        {
            "name": "get_weather",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
        {"name": "noop", "description": "", "parameters": {"type": "object", "properties": {}}},
    ]


def test_plan_grammar_accepts_the_documented_calls_only(tokenizer):
    from engine.sampling.structured.compiler import GrammarCompiler

    comp = GrammarCompiler(tokenizer, len(tokenizer))

    def accepts(spec, text):
        m = comp.matcher(spec)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    two = one + '\n<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
    req = ToolPlan(_tools(), "required").spec()
    assert accepts(req, one) and accepts(req, two)
    assert not accepts(req, two + "\n" + one)  # at most one call per tool
    assert not accepts(
        req, '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    )  # city required
    assert not accepts(ToolPlan(_tools(), "required", parallel=False).spec(), two)
    named = ToolPlan(_tools(), "function", named="noop").spec()
    assert not accepts(named, one)
    auto = ToolPlan(_tools(), "auto").spec()
    assert auto.trigger == "<tool_call>" and accepts(auto, one[len("<tool_call>") :])
