"""Helpers the API tests share: one raw HTTP call that keeps error bodies, and the OpenAI error
shape check. Here so that no test module imports another."""

import json
import urllib.error
import urllib.request


def raw(url: str, body=None, headers=None, method=None):
    """(status, parsed JSON body, headers) of one HTTP call, error or not."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method or ("POST" if data is not None else "GET"),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, _json(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, _json(e.read()), e.headers


def _json(data: bytes):
    try:
        return json.loads(data or b"null")
    except ValueError:
        return data.decode(errors="replace")  # e.g. a CORS preflight's plain-text answer


def assert_openai_error(status_body, status: int, *words):
    code, body, _ = status_body
    assert code == status, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    for w in words:
        assert w in err["message"]
    return err
