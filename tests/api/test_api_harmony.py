"""gpt-oss on /v1/chat/completions with the official `openai` client (issue 51): a harmony reply's
analysis channel comes back as `reasoning_content`, its final channel as `content`, streamed and
not, with the analysis tokens in `usage.completion_tokens_details`; the engine stops at
<|return|>; the next turn's prompt does not carry the analysis; reasoning_effort reaches the
template.

The model is the shipped gpt-oss config shrunk to 2 layers with random weights
(tests/engine/exec/hybrid_helpers.py) and the harmony tokenizer and template of
tests/engine/family_chat.py; a grammar naming the marker tokens makes it write
`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>`,
so what is split is the real engine's real output, markers kept in its text by the engine itself.
"""

import pytest

from tests.api.conftest import LiveServer, build_server_app
from tests.engine.family_chat import family_tokenizer


def _grammar(tok):
    i = {
        m: tok.convert_tokens_to_ids(m)
        for m in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>")
    }
    return (
        f'start: <[{i["<|channel|>"]}]> "analysis" <[{i["<|message|>"]}]> /[a-z]{{2,6}}( [a-z]{{2,6}}){{2,4}}/ '
        f'<[{i["<|end|>"]}]> <[{i["<|start|>"]}]> "assistant" <[{i["<|channel|>"]}]> "final" '
        f'<[{i["<|message|>"]}]> /[A-Z][a-z]{{2,6}}( [a-z]{{2,6}}){{1,3}}/ <[{i["<|return|>"]}]>'
    )


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    from engine import ServingLLM
    from tests.engine.exec import hybrid_helpers as H

    folder = tmp_path_factory.mktemp("tiny-gpt-oss")
    tok = family_tokenizer("gpt_oss")
    cfg = H.config("gpt_oss")
    cfg.vocab_size, cfg.bos_token_id, cfg.pad_token_id = len(tok), None, None
    cfg.eos_token_id = tok.convert_tokens_to_ids("<|return|>")  # as gpt-oss's config.json: one end
    cfg.save_pretrained(folder)
    tok.save_pretrained(folder)
    llm = ServingLLM(
        model=str(folder), load_format="dummy", num_blocks=48, device="cpu", max_model_len=384
    )
    server = LiveServer(build_server_app(llm))
    yield llm, server, tok
    server.stop()
    llm.shutdown()


def test_analysis_is_reasoning_content_final_is_content_streamed_and_not(harmony_server):
    import openai

    llm, server, tok = harmony_server
    assert llm.model_info().reasoning_markers == ("<|message|>", "<|end|>")
    assert tok.convert_tokens_to_ids("<|call|>") in llm.model_info().eos_token_ids
    client = openai.OpenAI(base_url=server.url + "v1", api_key="none")
    model = client.models.list().data[0].id
    hi = [{"role": "user", "content": "hi"}]
    kw = dict(
        model=model,
        messages=hi,
        max_tokens=80,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": _grammar(tok)}},
    )
    r = client.chat.completions.create(**kw)
    msg, usage = r.choices[0].message, r.usage
    reasoning = msg.model_extra["reasoning_content"]
    assert r.choices[0].finish_reason == "stop"
    assert (
        reasoning
        and reasoning == reasoning.lower()
        and "<|" not in reasoning
        and "analysis" not in reasoning
    )
    assert (
        msg.content
        and msg.content[0].isupper()
        and "<|" not in msg.content
        and "final" not in msg.content
    )
    assert 0 < usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens
    stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw
    )
    parts, streamed_usage = {"reasoning_content": "", "content": ""}, None
    for chunk in stream:
        streamed_usage = chunk.usage or streamed_usage
        for ch in chunk.choices:
            parts["content"] += ch.delta.content or ""
            parts["reasoning_content"] += (ch.delta.model_extra or {}).get(
                "reasoning_content"
            ) or ""
    assert parts == {
        "reasoning_content": reasoning,
        "content": msg.content,
    }  # greedy: the same reply
    assert (
        streamed_usage.completion_tokens_details.reasoning_tokens
        == usage.completion_tokens_details.reasoning_tokens
    )

    final_only = (
        _grammar(tok).split('"analysis"')[0] + '"final" ' + _grammar(tok).split('"final" ')[1]
    )
    direct = client.chat.completions.create(
        model=model,
        messages=hi,
        max_tokens=40,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": final_only}},
    )
    assert direct.choices[0].message.model_extra["reasoning_content"] is None
    assert direct.choices[0].message.content and "<|" not in direct.choices[0].message.content
    assert direct.usage.completion_tokens_details.reasoning_tokens == 0

    # the engine's batch API splits alike; its stored text (markers kept) gives the next prompt
    # without the analysis: the same ids as the answer alone
    from engine import SamplingParams
    from engine.sampling.structured.spec import StructuredSpec
    from engine.text.session_prompt import continue_session_prompt

    out = llm.chat(
        hi,
        SamplingParams(
            temperature=0, max_tokens=80, structured=StructuredSpec("grammar", _grammar(tok))
        ),
    )[0].outputs[0]
    assert (out.reasoning, out.content) == (reasoning, msg.content)
    assert out.text.startswith("<|channel|>analysis<|message|>") and "<|return|>" not in out.text
    nxt = {"role": "user", "content": "and?"}
    whole = continue_session_prompt(
        tok, hi + [{"role": "assistant", "content": out.text}, nxt], None
    )
    answer_only = continue_session_prompt(
        tok, hi + [{"role": "assistant", "content": out.content}, nxt], None
    )
    assert whole == answer_only and reasoning not in tok.decode(whole, skip_special_tokens=False)
    again = client.chat.completions.create(
        model=model,
        max_tokens=1,
        messages=hi
        + [{"role": "assistant", "content": msg.content, "reasoning_content": reasoning}, nxt],
    )
    assert again.usage.prompt_tokens == len(answer_only)

    # reasoning_effort: OpenAI's field and chat_template_kwargs' reach the template alike
    efforts = {
        e: client.chat.completions.create(
            model=model, messages=hi, max_tokens=1, reasoning_effort=e
        ).usage.prompt_tokens
        for e in ("low", "high")
    }
    kwarg = client.chat.completions.create(
        model=model,
        messages=hi,
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}},
    )
    default = client.chat.completions.create(model=model, messages=hi, max_tokens=1)
    assert kwarg.usage.prompt_tokens == efforts["high"]
    from engine.text.chat_tokens import encode_chat

    for e, n in efforts.items():
        assert n == len(encode_chat(tok, hi, reasoning_effort=e))
    assert default.usage.prompt_tokens == len(encode_chat(tok, hi, reasoning_effort="medium"))
    assert len({*efforts.values(), default.usage.prompt_tokens}) > 1
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model,
            messages=hi,
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"reasoning_effort": "max"}},
        )
