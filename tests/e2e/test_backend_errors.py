"""`app.py --backend URL` when the backend misbehaves (a test-only FastAPI server stands in for it:
tests/backends/fake_backend.py): HTTP 500, a stream that breaks off, and a backend unreachable at
start-up. Each gives the user a clear message and loses nothing already stored; the app's own
history keeps working. The front app loads no model, so these run in seconds."""

from __future__ import annotations

import pytest
from gradio_client import Client

from tests.backends.fake_backend import FakeBackend, unused_url

pytestmark = pytest.mark.slow


@pytest.fixture
def fake():
    fb = FakeBackend().start()
    yield fb
    fb.stop()


def _messages(api, db):
    return api.read_db(db, "SELECT role, content, status FROM messages ORDER BY id")


def test_http_500_then_a_dropped_stream_then_recovery(launch, fake, chat_api):
    api = chat_api
    server = launch(args=["--backend", fake.url])
    import urllib.error

    with pytest.raises(urllib.error.HTTPError):  # no local engine: no local /v1 or /api/kv
        server.get("v1/models")
    c = Client(server.url, verbose=False)
    out = c.predict("first question", *api.sampling(max_tokens=8), api_name="/send")
    reply = api.reply_text(out)
    assert reply.startswith("Hello there")  # the happy path through the fake
    assert (
        "reused 8 of 12 prompt tokens from cache" in reply and "TTFT" in reply
    )  # usage + client-side stats

    fake.mode = "500"
    out = c.predict("second question", *api.sampling(max_tokens=8), api_name="/send")
    assert "could not answer" in api.reply_text(out) and "HTTP 500" in api.reply_text(out)
    assert "CUDA out of memory (simulated)" in out[2]
    rows = _messages(api, server.db)
    assert [(r["role"], r["content"]) for r in rows if r["role"] == "user"] == [
        ("user", "first question"),
        ("user", "second question"),
    ]  # the question is kept
    assert rows[1]["content"] == "Hello there" and rows[1]["status"] == "complete"

    fake.mode = "drop"
    out = c.predict("third question", *api.sampling(max_tokens=8), api_name="/send")
    assert api.reply_text(out).startswith("Hello there")  # the partial reply stays on screen
    assert "could not answer" in out[2] and "stream" in out[2]
    last = _messages(api, server.db)[-1]
    assert last == {"role": "assistant", "content": "Hello there", "status": "error"}

    fake.mode = "ok"  # the next message works again
    out = c.predict("fourth question", *api.sampling(max_tokens=8), api_name="/send")
    assert api.reply_text(out).startswith("Hello there")
    # every turn sent the whole branch (no remote sessions): the last body holds all four questions
    sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "user"]
    assert sent[-1] == "fourth question" and "first question" in sent and "third question" in sent
    c.close()


def test_backend_unreachable_at_start_up(launch, chat_api, tmp_path):
    api = chat_api
    dead = unused_url()
    server = launch(args=["--backend", dead])
    assert "WARNING" in server.log() and dead in server.log()
    c = Client(server.url, verbose=False)
    out = c.predict("anyone there?", *api.sampling(max_tokens=8), api_name="/send")
    assert "Cannot reach the backend" in api.reply_text(out)
    rows = _messages(api, server.db)
    assert [(r["role"], r["content"]) for r in rows] == [("user", "anyone there?")]
    c.close()
    assert server.stop() == 0
