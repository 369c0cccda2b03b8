"""The API through the official `openai` client: models, chat and completions, sync / async /
streaming, n, stop, seed, max_completion_tokens, usage with cached_tokens, and greedy output equal
to LLM.chat / LLM.generate on the same engine (itself tested token-identical to HF)."""

from __future__ import annotations

import asyncio

from engine import SamplingParams

HELLO = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three colours."},
]


def test_models_lists_the_served_model(client, model_id):
    models = client.models.list().data
    assert [m.id for m in models] == [model_id]
    assert model_id.startswith("SmolLM2-135M-Instruct")


def test_greedy_chat_equals_llm_chat(client, llm, model_id):
    ref = llm.chat(HELLO, SamplingParams(temperature=0.0, max_tokens=24))[0]
    r = client.chat.completions.create(model=model_id, messages=HELLO, temperature=0, max_tokens=24)
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content == ref.outputs[0].text
    assert c.finish_reason == ref.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # llm.chat left the same prompt's full blocks in the prefix cache (same salt: one local user);
    # the last prompt token is always computed, so a block-aligned prompt hits one block less
    bs = llm.model_info().block_size
    assert (
        r.usage.prompt_tokens_details.cached_tokens
        == (len(ref.prompt_token_ids) - 1) // bs * bs
        > 0
    )
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"


def test_greedy_completions_equal_llm_generate_for_text_and_token_prompts(client, llm, model_id):
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    ref = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    r = client.completions.create(model=model_id, prompt=prompts, temperature=0, max_tokens=12)
    assert [c.text for c in r.choices] == [o.outputs[0].text for o in ref]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in ref)
    ids = ref[0].prompt_token_ids
    r2 = client.completions.create(model=model_id, prompt=ids, temperature=0, max_tokens=12)
    assert r2.choices[0].text == ref[0].outputs[0].text
    assert r2.usage.prompt_tokens == len(ids)


def test_streaming_chat_matches_non_streaming_and_reports_usage_last(client, model_id):
    full = client.chat.completions.create(
        model=model_id, messages=HELLO, temperature=0, max_tokens=20
    )
    chunks = list(
        client.chat.completions.create(
            model=model_id,
            messages=HELLO,
            temperature=0,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finishes = [
        ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason
    ]
    assert finishes == [full.choices[0].finish_reason]
    assert all(ch.usage is None for ch in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == full.usage.completion_tokens
    assert last.usage.prompt_tokens_details.cached_tokens > 0  # same prompt as `full`, just before


def test_streaming_without_include_usage_sends_no_usage(client, model_id):
    chunks = list(
        client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=4, stream=True)
    )
    assert chunks and all(getattr(ch, "usage", None) is None for ch in chunks)


def test_n_choices_stop_and_max_completion_tokens(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=HELLO, n=3, temperature=1.0, seed=7, max_completion_tokens=8
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)
    assert r.usage.completion_tokens <= 3 * 8
    stopped = client.completions.create(
        model=model_id, prompt="1, 2, 3, 4,", temperature=0, max_tokens=20, stop=[" 7"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert " 7" not in stopped.choices[0].text and stopped.choices[0].text.strip().endswith("6,")


def test_seed_makes_sampling_reproducible(client, model_id):
    def once(seed):
        return (
            client.chat.completions.create(
                model=model_id,
                messages=HELLO,
                temperature=1.0,
                top_p=0.95,
                seed=seed,
                max_tokens=16,
            )
            .choices[0]
            .message.content
        )

    assert once(1234) == once(1234)
    assert len({once(s) for s in (1, 2, 3)}) > 1


def test_async_client_chat_and_streaming(aclient, model_id):
    async def main():
        r = await aclient.chat.completions.create(
            model=model_id, messages=HELLO, temperature=0, max_tokens=10
        )
        stream = await aclient.chat.completions.create(
            model=model_id, messages=HELLO, temperature=0, max_tokens=10, stream=True
        )
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        c = await aclient.completions.create(model=model_id, prompt="Hello", max_tokens=3)
        return r.choices[0].message.content, "".join(parts), c

    text, streamed, c = asyncio.run(main())
    assert text == streamed and text
    assert c.object == "text_completion" and c.usage.completion_tokens <= 3


def test_streaming_completions_with_n_and_usage(client, model_id):
    chunks = list(
        client.completions.create(
            model=model_id,
            prompt="Once upon a time",
            n=2,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    for ch in chunks[:-1]:
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts[0] == texts[1] and texts[0]  # greedy: both children say the same
    assert chunks[-1].usage.completion_tokens == 12


def test_content_parts_and_developer_role_are_accepted(client, llm, model_id):
    parts = [
        {"role": "developer", "content": "You are a concise assistant."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Name three "},
                {"type": "text", "text": "colours."},
            ],
        },
    ]
    r = client.chat.completions.create(model=model_id, messages=parts, temperature=0, max_tokens=12)
    ref = llm.chat(HELLO, SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert r.choices[0].message.content == ref.outputs[0].text


def test_sse_parser_reads_our_stream_like_a_remote_backend_would(server, model_id):
    """backends.remote_stream.iter_sse_events (the remote backend reads /v1 streams with it) on a raw HTTP stream."""
    import httpx

    from backends.remote_stream import iter_sse_events

    body = {
        "model": model_id,
        "messages": HELLO,
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "v1/chat/completions", json=body, timeout=120) as r:
        events = list(iter_sse_events(r.iter_lines()))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] <= 8
    assert list(
        iter_sse_events([": keep-alive", "", 'data: {"a": 1}', "data: [DONE]", 'data: {"b": 2}'])
    ) == [{"a": 1}]
