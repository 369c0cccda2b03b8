"""A thinking model on /v1/chat/completions (issue 45), with the official `openai` client: the reply's
reasoning comes back as `reasoning_content` (vLLM's field), streamed and not, the answer as
`content`, the reasoning tokens in `usage.completion_tokens_details`; `chat_template_kwargs`'s
enable_thinking reaches the template.

The model is a tiny random Qwen3 (engine/exec/configs/qwen3-0.6b.json, shrunk) with a Qwen3-style
tokenizer and template (tests/engine/family_chat.py); a grammar naming the marker tokens makes its random weights
write a reasoning block and an answer, so what is split is the engine's real output.
"""

import pytest

from tests.api.conftest import LiveServer, build_server_app
from tests.engine.family_chat import family_tokenizer

GRAMMAR = (
    r"start: <[300]> /\n[a-z]{2,6}( [a-z]{2,6}){2,4}\n/ <[301]> /\n\n[a-z]{2,6}( [a-z]{2,6}){1,3}/"
)


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    from engine import ServingLLM
    from engine.exec import dummy_weights as dw

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    tok = family_tokenizer("qwen3")
    cfg = dw.load_config(
        "qwen3-0.6b",
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=len(tok),
            bos_token_id=None,
            pad_token_id=None,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        ),
    )
    cfg.save_pretrained(folder)
    tok.save_pretrained(folder)
    llm = ServingLLM(
        model=str(folder), load_format="dummy", num_blocks=64, device="cpu", max_model_len=256
    )
    server = LiveServer(build_server_app(llm))
    yield llm, server
    server.stop()
    llm.shutdown()


def _client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "v1", api_key="none")


def test_reasoning_content_streamed_and_not(thinking_server):
    llm, server = thinking_server
    assert (
        llm.model_info().reasoning_markers == ("<think>", "</think>")
        and llm.model_info().thinking_switch
    )
    client = _client(server)
    kw = dict(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": GRAMMAR}},
    )
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert msg.content and "think>" not in msg.content and not msg.content.startswith("\n")
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw
    )
    parts = {"reasoning_content": "", "content": ""}
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            parts["content"] += d.content or ""
            parts["reasoning_content"] += (d.model_extra or {}).get("reasoning_content") or ""
    assert parts == {
        "reasoning_content": reasoning,
        "content": msg.content,
    }  # greedy: the same reply
    assert (
        usage.completion_tokens_details.reasoning_tokens
        == r.usage.completion_tokens_details.reasoning_tokens
    )


def test_enable_thinking_reaches_the_template_and_the_batch_api_splits_alike(thinking_server):
    """With enable_thinking false the template writes an empty reasoning block into the prompt
    (more prompt tokens); the engine's batch API (LLM.chat) splits a reply as the route does."""
    from engine import SamplingParams
    from engine.sampling.structured.spec import StructuredSpec

    llm, server = thinking_server
    client = _client(server)
    msgs = [{"role": "user", "content": "hi"}]
    kw = dict(model=client.models.list().data[0].id, messages=msgs, max_tokens=4)
    on = client.chat.completions.create(**kw)
    off = client.chat.completions.create(
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw
    )
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    assert llm.count_prompt_tokens(msgs, thinking=False) == off.usage.prompt_tokens
    routed = client.chat.completions.create(
        model=kw["model"],
        messages=msgs,
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": GRAMMAR}},
    )
    out = llm.chat(
        msgs,
        SamplingParams(temperature=0, max_tokens=60, structured=StructuredSpec("grammar", GRAMMAR)),
    )[0].outputs[0]
    assert out.reasoning == routed.choices[0].message.model_extra["reasoning_content"]
    assert out.content == routed.choices[0].message.content
    assert out.reasoning_tokens == routed.usage.completion_tokens_details.reasoning_tokens > 0
