"""Issue #12 items 8, 12, 13 end to end: the real `python app.py` with --auth-file, PAGED_CHAT_AUTH
and --allowed-host. Foreign Host names get 421, API docs are gone (never 500), failed logins are
throttled, hashed users from the file and the environment can log in, and the DB file is 0600."""

import http.client
import os
import stat
import urllib.parse

import pytest
from gradio_client import Client

from routes.security.auth import hash_password

pytestmark = pytest.mark.slow


def _request(server, method, path, host=None, body=None, forwarded_for=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{server.port}"}
    if forwarded_for:
        headers["X-Forwarded-For"] = forwarded_for
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        body = urllib.parse.urlencode(body)
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    out = (r.status, r.read().decode(errors="replace"), dict(r.getheaders()))
    conn.close()
    return out


def test_host_check_docs_login_throttle_and_private_db(launch, tmp_path):
    users = tmp_path / "users"
    users.write_text(f"# test users\nalice:{hash_password('wonderland')}\n")
    users.chmod(0o600)
    server = launch(
        args=[
            "--num-blocks",
            "128",
            "--max-model-len",
            "256",
            "--auth-file",
            str(users),
            "--allowed-host",
            "chat.lan",
        ],
        env={"PAGED_CHAT_AUTH": "bob:builder"},
    )
    assert "builder" not in " ".join(server.proc.args)  # the password is not on the command line

    for path in ("/config", "/api/kv", "/metrics", "/"):
        status, text, _ = _request(server, "GET", path, host="evil.example")
        assert status == 421, (path, status)
        assert "conversation" not in text
    assert _request(server, "GET", "/metrics", host="chat.lan")[0] == 200
    assert _request(server, "GET", "/metrics", host=f"localhost:{server.port}")[0] == 200

    for path in ("/docs", "/redoc", "/openapi.json"):
        assert _request(server, "GET", path)[0] == 404, path

    # a new made-up X-Forwarded-For each time does not reset the count: no proxy is trusted by default
    codes = [
        _request(
            server,
            "POST",
            "/login",
            body={"username": "alice", "password": f"x{i}"},
            forwarded_for=f"10.0.0.{i}",
        )[0]
        for i in range(6)
    ]
    assert codes == [400] * 5 + [429]
    assert (
        _request(server, "POST", "/login", body={"username": "bob", "password": "builder"})[0]
        == 200
    )

    bob = Client(server.url, auth=("bob", "builder"), verbose=False)
    bob.close()
    assert stat.S_IMODE(os.stat(server.db).st_mode) == 0o600


def test_share_serves_this_app_with_its_guards_even_when_the_tunnel_fails(launch):
    """--share used to hand the page to Gradio's own launcher, without the Host check, the owner-only
    exports and the scoped /api/kv. Now the same app serves; the tunnel (which needs internet, absent
    here) only adds its host name. Without a tunnel the app keeps serving locally and says so.
    Also --trusted-proxy: behind a named proxy, logins are throttled per forwarded client address."""
    import time

    server = launch(
        args=[
            "--num-blocks",
            "128",
            "--max-model-len",
            "256",
            "--share",
            "--auth",
            "alice:wonderland",
            "--trusted-proxy",
            "127.0.0.1",
        ],
        env={"GRADIO_SHARE_SERVER_ADDRESS": "127.0.0.1:9"},
    )  # a port nothing listens on
    assert _request(server, "GET", "/config", host="evil.example")[0] == 421
    assert _request(server, "GET", "/api/kv")[0] == 401  # the scoped route, login needed
    assert _request(server, "GET", "/exports/x/y.json")[0] == 404  # our route is there
    deadline = time.time() + 60
    while "could not open a share link" not in server.log() and time.time() < deadline:
        time.sleep(0.5)
    assert "could not open a share link" in server.log()
    assert _request(server, "GET", "/metrics")[0] == 200  # still serving
    login = dict(body={"username": "alice", "password": "wrong"})
    codes = [
        _request(server, "POST", "/login", forwarded_for="203.0.113.7", **login)[0]
        for _ in range(6)
    ]
    assert codes == [400] * 5 + [429]
    assert (
        _request(server, "POST", "/login", forwarded_for="203.0.113.8", **login)[0] == 400
    )  # another client
