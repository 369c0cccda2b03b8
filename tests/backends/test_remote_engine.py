"""RemoteEngine against a misbehaving OpenAI server (tests/backends/fake_backend.py): every failure
becomes a clear message for that request only; streams, stats, abort and request bodies."""

from __future__ import annotations

import asyncio

import pytest

from backends import BackendError, RemoteEngine
from engine import SamplingParams
from engine.protocol import ChatEngine
from tests.backends.fake_backend import FakeBackend, unused_url

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake():
    fb = FakeBackend().start()
    yield fb
    fb.stop()


def test_implements_the_ui_protocol(fake):
    eng = RemoteEngine(fake.url)
    assert isinstance(eng, ChatEngine)
    assert eng.model == "fake" and eng.max_model_len == 2048 and eng.startup_error is None
    assert eng.end_session("c1") is False and eng.close_session("c1") is False  # no remote sessions
    assert eng.model_info().block_size == 128  # from vLLM's cache_config_info (issue 47)
    from backends.remote import block_size_of

    assert (
        block_size_of("paged_chat_kv_block_size_tokens 16\n") == 16 and block_size_of("x 1\n") == 0
    )


def test_stream_text_finish_and_stats(fake):
    eng = RemoteEngine(fake.url + "/v1/")
    deltas = list(
        eng.submit_chat(
            MESSAGES, SamplingParams(max_tokens=5, temperature=0.0, seed=3, repetition_penalty=1.1)
        )
    )
    assert "".join(d.text for d in deltas) == "Hello there"
    last = deltas[-1]
    assert last.finished and last.finish_reason == "stop" and last.error is None
    assert last.metrics["prompt_tokens"] == 12 and last.metrics["cached_tokens"] == 8
    assert last.metrics["output_tokens"] == 2 and last.metrics["ttft_s"] >= 0
    body = fake.requests[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == MESSAGES and body["max_tokens"] == 5 and body["seed"] == 3
    assert body["repetition_penalty"] == 1.1 and "top_k" not in body


def test_http_500_is_a_clear_refusal(fake):
    fake.mode = "500"
    eng = RemoteEngine(fake.url)
    with pytest.raises(BackendError, match=r"HTTP 500: CUDA out of memory \(simulated\)"):
        eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4))
    fake.mode = "ok"  # the next request is unaffected
    assert (
        "".join(d.text for d in eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4)))
        == "Hello there"
    )


def test_dropped_stream_ends_with_error_and_keeps_text(fake):
    fake.mode = "drop"
    eng = RemoteEngine(fake.url)
    deltas = list(eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4)))
    assert "".join(d.text for d in deltas) == "Hello there"
    assert deltas[-1].finished and deltas[-1].finish_reason == "error"
    assert "broke off" in deltas[-1].error or "before the reply finished" in deltas[-1].error


def test_unreachable_backend_starts_then_says_so():
    eng = RemoteEngine(unused_url())
    assert eng.startup_error and "unavailable" in eng.startup_error
    with pytest.raises(BackendError, match="Cannot reach the backend"):
        eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4))


def test_abort_hangs_up_and_the_server_sees_it(fake):
    fake.mode = "slow"
    eng = RemoteEngine(fake.url)

    async def consume():
        stream = eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4), request_id="r1")
        out = []
        async for d in stream:
            out.append(d)
            if len(out) == 3:
                assert eng.abort("r1")
        return out

    out = asyncio.run(consume())
    assert out[-1].finished and out[-1].finish_reason == "abort" and out[-1].error is None
    assert fake.disconnected.wait(10), "the server never saw the client hang up"
    assert eng.abort("r1") is False  # forgotten once closed


def test_metrics_and_no_kv_snapshot(fake):
    eng = RemoteEngine(fake.url)
    assert "vllm:kv_cache_usage_perc" in eng.metrics_text()
    with pytest.raises(RuntimeError, match="no KV snapshot"):
        eng.latest_snapshot()


def test_many_async_streams_on_one_loop(fake):
    """Each `async for` consumer is fed through its own loop (no worker thread parked per stream)."""
    eng = RemoteEngine(fake.url)

    async def one(k):
        stream = await asyncio.to_thread(
            eng.submit_chat, MESSAGES, SamplingParams(max_tokens=4), request_id=f"r{k}"
        )
        return "".join([d.text async for d in stream])

    async def main():
        return await asyncio.gather(*(one(k) for k in range(12)))

    assert asyncio.run(main()) == ["Hello there"] * 12


def test_backend_key_is_sent_and_a_wrong_one_is_named():
    fb = FakeBackend(key="s3cret").start()
    try:
        with pytest.raises(BackendError, match="HTTP 401: Invalid API key"):
            RemoteEngine(fb.url, api_key="wrong").submit_chat(
                MESSAGES, SamplingParams(max_tokens=4)
            )
        eng = RemoteEngine(fb.url, api_key="s3cret")
        assert (
            "".join(d.text for d in eng.submit_chat(MESSAGES, SamplingParams(max_tokens=4)))
            == "Hello there"
        )
    finally:
        fb.stop()
