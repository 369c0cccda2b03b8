"""Issue #29 items 8 and 9: /v1 refuses oversized or malformed input before parsing and tokenizing,
in OpenAI's error shape (never FastAPI's `{"detail"}` nor a plain-text 500). Real engine, real
uvicorn, raw HTTP (the official client cannot send lone surrogates or bad UTF-8)."""

from __future__ import annotations

import http.client
import json

import pytest

from routes.security import request_limits as L
from tests.api.conftest import wait_idle
from tests.api.helpers import assert_openai_error, raw


def _chat(model_id, content="Hi", **kw):
    return {
        "model": model_id,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        **kw,
    }


def test_a_body_over_the_cap_is_413_in_openai_shape(server, model_id, llm):
    body = json.dumps(_chat(model_id, "x" * (L.MAX_BODY_BYTES + 10))).encode()
    err = assert_openai_error(raw(server.url + "v1/chat/completions", body), 413, "larger than")
    assert err["type"] == "invalid_request_error"
    assert wait_idle(llm)["waiting"] == 0


def test_a_chunked_body_that_grows_past_the_cap_is_413(server, model_id):
    """No Content-Length to trust: the cap holds while the body is read."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b"x" * (256 * 1024)
    try:
        for _ in range(L.MAX_BODY_BYTES // len(chunk) + 2):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before the end
    r = conn.getresponse()
    assert r.status == 413
    assert "error" in json.loads(r.read())
    conn.close()


def test_too_many_messages_are_refused_by_count(server, model_id):
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
        for i in range(L.MAX_MESSAGES + 1)
    ]
    body = {"model": model_id, "messages": msgs, "max_tokens": 1}
    assert_openai_error(
        raw(server.url + "v1/chat/completions", body), 400, "at most 1,000 messages"
    )


def test_too_many_characters_are_refused_before_tokenizing(server, model_id):
    body = _chat(model_id, "word " * (L.MAX_CHARS // 5 + 10))
    err = assert_openai_error(raw(server.url + "v1/chat/completions", body), 400, "characters")
    assert err["code"] == "too_long"


def test_twenty_thousand_prompts_are_refused_before_any_is_tokenized(server, model_id, llm):
    body = {"model": model_id, "prompt": ["Hello there"] * 20_000, "max_tokens": 1}
    err = assert_openai_error(raw(server.url + "v1/completions", body), 400, "sequences")
    assert err["param"] == "prompt"
    assert wait_idle(llm)["waiting"] == 0


@pytest.mark.parametrize("where", ["chat", "completion"])
def test_a_lone_surrogate_is_400_not_a_plain_500(server, model_id, where):
    if where == "chat":
        text = '{"model": %s, "messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 1}'
        path = "v1/chat/completions"
    else:
        text = '{"model": %s, "prompt": "hi \\udfff", "max_tokens": 1}'
        path = "v1/completions"
    body = (text % json.dumps(model_id)).encode()
    err = assert_openai_error(raw(server.url + path, body), 400, "surrogate")
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, word",
    [
        (None, "not valid JSON"),  # an int past Python's digit limit
        (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe caf\xc3"}]}', "UTF-8"),
    ],
)
def test_huge_ints_deep_nesting_and_bad_utf8_get_the_openai_shape(server, model_id, body, word):
    if body is None:
        body = (
            '{"model": %s, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1%s}'
            % (json.dumps(model_id), "0" * 5000)
        ).encode()
    code, parsed, _ = raw(server.url + "v1/chat/completions", body)
    assert isinstance(parsed, dict) and "detail" not in parsed, parsed
    assert_openai_error((code, parsed, None), 400, word)


def test_ordinary_requests_still_pass(client, model_id):
    out = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
    )
    assert out.choices[0].message.content is not None
    out = client.completions.create(
        model=model_id, prompt=["Hello", "World"], max_tokens=1, temperature=0
    )
    assert len(out.choices) == 2


def test_a_cross_site_page_cannot_get_the_right_key_throttled(llm, model_id):
    """#29.6: no-cors requests from another site's page with wrong keys used to raise the wait of
    the address they share with the local user (127.0.0.1); then the right key got 429."""
    from tests.api.conftest import API_KEY, LiveServer, build_server_app

    srv = LiveServer(build_server_app(llm, api_keys=[API_KEY]))
    try:
        page = {
            "Origin": "http://evil.example",
            "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "no-cors",
        }
        for i in range(30):
            code, _, _ = raw(
                srv.url + "v1/models", None, {**page, "Authorization": f"Bearer wrong-{i}"}
            )
            assert code == 403
        for _ in range(5):
            code, body, _ = raw(srv.url + "v1/models", None, {"Authorization": f"Bearer {API_KEY}"})
            assert code == 200, body
        # the throttle itself still works for the address's own wrong keys
        codes = [
            raw(srv.url + "v1/models", None, {"Authorization": f"Bearer bad-{i}"})[0]
            for i in range(6)
        ]
        assert codes == [401] * 5 + [429]
    finally:
        srv.stop()
