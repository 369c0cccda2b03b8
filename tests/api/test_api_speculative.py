"""Speculative decoding through /v1 with the official openai client: the same greedy text with
drafts as without, vLLM's spec_decode counters on /metrics, and the per-request opt-out
(`extra_body={"speculative": False}`)."""

from __future__ import annotations

import re
import urllib.request

import pytest

from tests.api.conftest import API_KEY, LiveServer, build_server_app

CODE = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
MESSAGES = [
    {
        "role": "user",
        "content": f"Rename w to width and h to height; show the whole code:\n```python\n{CODE}```",
    }
]


@pytest.fixture(scope="module")
def spec_server():
    from engine import ServingLLM

    llm = ServingLLM(
        num_blocks=256, max_model_len=1024, speculative="ngram", speculative_adaptive=False
    )
    server = LiveServer(build_server_app(llm, api_keys=[API_KEY]))
    yield llm, server
    server.stop()
    llm.shutdown()


def _counter(server, name: str) -> float:
    with urllib.request.urlopen(server.url + "metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_drafts_through_the_api_keep_the_greedy_text_and_show_on_metrics(spec_server):
    import openai

    llm, server = spec_server
    client = openai.OpenAI(base_url=server.url + "v1", api_key=API_KEY)
    model = client.models.list().data[0].id
    before = _counter(server, "vllm:spec_decode_num_accepted_tokens_total")
    with_drafts = client.chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=60
    )
    accepted = _counter(server, "vllm:spec_decode_num_accepted_tokens_total")
    assert accepted > before
    assert _counter(server, "vllm:spec_decode_num_draft_tokens_total") >= accepted
    drafted = _counter(server, "vllm:spec_decode_num_draft_tokens_total")
    without = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        temperature=0,
        max_tokens=60,
        extra_body={"speculative": False},
    )
    assert (
        _counter(server, "vllm:spec_decode_num_draft_tokens_total") == drafted
    )  # opted out: no drafts
    assert with_drafts.choices[0].message.content == without.choices[0].message.content
    assert with_drafts.usage.completion_tokens == without.usage.completion_tokens


def test_speculative_field_must_be_a_boolean(spec_server):
    import openai

    llm, server = spec_server
    client = openai.OpenAI(base_url=server.url + "v1", api_key=API_KEY)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=MESSAGES,
            max_tokens=4,
            extra_body={"speculative": "sometimes"},
        )
