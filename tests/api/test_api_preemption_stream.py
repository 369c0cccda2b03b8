"""The engine tells a preempted request's stream "preempted" / "resumed" (engine/outputs.py). Those
deltas carry no text: the OpenAI streaming routes must not turn them into chunks. A pool of 6
blocks makes three concurrent streams preempt each other; there must still be exactly one chunk
per generated token (plus the chat route's opening role chunk and finish chunk)."""

import json
import threading

import pytest

from tests.api.conftest import LiveServer, build_server_app, wait_idle


@pytest.fixture(scope="module")
def small_server():
    from engine import ServingLLM

    llm = ServingLLM(num_blocks=6, max_model_len=96, max_num_seqs=3)
    srv = LiveServer(build_server_app(llm))
    yield srv, llm
    srv.stop()
    try:
        assert wait_idle(llm)["used_blocks"] == 0
    finally:
        llm.shutdown()


def _stream(url: str, body: dict, out: list) -> None:
    import httpx

    try:
        with httpx.stream("POST", url, json=body, timeout=300) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    out.append(json.loads(line[5:]))
    except Exception as e:  # reported by the test, not lost in the thread
        out.append(e)


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_preemption_events_make_no_empty_chunks(small_server, route):
    srv, llm = small_server
    before = llm.stats()["num_preemptions"]
    import httpx

    model = httpx.get(srv.url + "v1/models").json()["data"][0]["id"]
    topics = ["a dragon", "the sea", "a city"]
    results = [[] for _ in topics]
    threads = []
    for t, out in zip(topics, results):
        body = {
            "model": model,
            "max_tokens": 40,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        if route == "chat/completions":
            body["messages"] = [{"role": "user", "content": f"Tell me about {t}."}]
        else:
            body["prompt"] = f"A story about {t}:"
        threads.append(threading.Thread(target=_stream, args=(srv.url + "v1/" + route, body, out)))
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert llm.stats()["num_preemptions"] > before, "the pool was meant to force a preemption"
    assert not [c for r in results for c in r if isinstance(c, Exception)]
    for chunks in results:  # one chunk per generated token (+ the chat's opening and finish chunks)
        if route == "chat/completions":
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            rest = [c["choices"][0] for c in chunks[1:]]
            assert len(rest) == 40 + 1 and all("content" in c["delta"] for c in rest[:-1])
        else:
            rest = [c["choices"][0] for c in chunks]
            assert len(rest) == 40
        assert rest[-1]["finish_reason"] == "length"
