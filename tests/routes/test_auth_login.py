"""Issue #12 item 13: hashed credentials from a file or the environment, and login throttling.

The login flow runs through Gradio's real /login route mounted the way ui/layout.py mounts it,
with our throttle middleware in front; the clock of the throttle is a test clock, not sleeps.
"""

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

import fastapi
import gradio as gr
import pytest
from fastapi.testclient import TestClient

import app as app_module
from routes.security.auth import (
    Credentials,
    LoginThrottle,
    check_hash_format,
    hash_password,
    load_credentials,
    parse_auth_file_text,
    parse_env_auth,
    verify_password,
)
from routes.security.hash_budget import HashBudget
from routes.security.host_guard import install_security

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_scrypt_hash_round_trip_and_salting():
    h1, h2 = hash_password("pw1"), hash_password("pw1")
    assert h1.startswith("scrypt$16384$8$1$") and h1 != h2  # fresh salt each time
    assert verify_password("pw1", h1) and verify_password("pw1", h2)
    assert not verify_password("pw2", h1) and not verify_password("", h1)


def test_pbkdf2_hashes_are_accepted():
    salt = b"0123456789abcdef"
    key = hashlib.pbkdf2_hmac("sha256", b"s3cret", salt, 1000)
    enc = f"pbkdf2_sha256$1000${base64.b64encode(salt).decode()}${base64.b64encode(key).decode()}"
    assert verify_password("s3cret", enc) and not verify_password("nope", enc)


@pytest.mark.parametrize(
    "bad",
    [
        "plaintext",
        "scrypt$16384$8$1$abc",
        "scrypt$1000$8$1$AAAA$AAAA",
        "pbkdf2_sha256$0$AAAA$AAAA",
        "scrypt$16384$8$1$!!$AAAA",
        "md5$x$y",
    ],
)
def test_malformed_hashes_are_refused(bad):
    with pytest.raises(ValueError):
        check_hash_format(bad)


def test_auth_file_format():
    h = hash_password("pw")
    users = parse_auth_file_text(f"# users\n\nalice:{h}\n  bob : {h}  \n")
    assert set(users) == {"alice", "bob"}
    with pytest.raises(ValueError, match="line 2"):
        parse_auth_file_text(f"alice:{h}\nbob:plainpassword\n")  # plain passwords not allowed here
    with pytest.raises(ValueError, match="line 1"):
        parse_auth_file_text("no-colon-here\n")


def test_env_variable_takes_plain_or_hashed_entries():
    h = hash_password("bobpw")
    users = parse_env_auth(f"alice:alice pw; bob:{h}\ncarol:c:d")
    assert verify_password("alice pw", users["alice"]) and users["bob"] == h
    assert verify_password("c:d", users["carol"])
    assert all(v.startswith("scrypt$") for v in users.values())  # nothing kept in plain text


def test_credentials_merge_all_sources(tmp_path):
    f = tmp_path / "users"
    f.write_text(f"bob:{hash_password('from-file')}\n")
    f.chmod(0o600)
    creds = load_credentials([("alice", "cli"), ("bob", "cli-bob")], str(f), "carol:env")
    assert (
        creds.verify("alice", "cli")
        and creds.verify("bob", "from-file")
        and creds.verify("carol", "env")
    )
    assert not creds.verify("bob", "cli-bob") and not creds.verify("dave", "cli")
    assert load_credentials(None, None, "") is None


def test_app_flags():
    a = app_module.parse_args(
        ["--auth-file", "users.txt", "--allowed-host", "chat.lan", "--allowed-host", "box.local"]
    )
    assert a.auth_file == "users.txt" and a.allowed_host == ["chat.lan", "box.local"]
    assert app_module.parse_args([]).allowed_host == []


def test_hash_cli_prints_a_usable_line():
    out = subprocess.run(
        [sys.executable, "-m", "routes.security.auth", "alice"],
        input="wonder land\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    user, _, enc = out.partition(":")
    assert user == "alice" and verify_password("wonder land", enc)


def test_throttle_backoff_per_user_and_address():
    clock = Clock()
    t = LoginThrottle(free_failures=3, max_delay_s=8, clock=clock)
    for _ in range(3):
        assert t.retry_after("alice", "1.2.3.4") == 0
        t.failed("alice", "1.2.3.4")
    assert t.retry_after("alice", "1.2.3.4") == 1  # 4th attempt waits 1 s
    assert t.retry_after("alice", "5.6.7.8") == 0  # other address: not locked out
    assert t.retry_after("bob", "1.2.3.4") == 0  # other user: not locked out
    clock.t += 1
    t.failed("alice", "1.2.3.4")
    assert t.retry_after("alice", "1.2.3.4") == 2
    for _ in range(10):
        clock.t += 100
        t.failed("alice", "1.2.3.4")
    assert t.retry_after("alice", "1.2.3.4") == 8  # capped
    t.succeeded("alice", "1.2.3.4")
    assert t.retry_after("alice", "1.2.3.4") == 0


@pytest.fixture
def login_app():
    clock = Clock()
    # share=1: no spacing between hashes (routes/security/hash_budget.py has its own tests)
    creds = Credentials(
        {"alice": hash_password("wonderland")},
        throttle=LoginThrottle(clock=clock),
        budget=HashBudget(share=1.0),
    )
    auth = creds.gradio_auth
    app = fastapi.FastAPI()
    with gr.Blocks() as demo:
        gr.Markdown("private")
    app = gr.mount_gradio_app(app, demo, path="/", auth=auth, ssr_mode=False)
    install_security(app, "127.0.0.1", (), auth=auth)
    with TestClient(app, base_url="http://127.0.0.1:7860") as client:
        yield client, clock


def _login(client, user, password):
    return client.post("/login", data={"username": user, "password": password})


def test_login_is_throttled_and_the_right_password_waits_too(login_app):
    client, clock = login_app
    codes = [_login(client, "alice", f"guess{i}").status_code for i in range(5)]
    assert codes == [400] * 5
    r = _login(client, "alice", "guess5")
    assert (
        r.status_code == 429
        and int(r.headers["retry-after"]) >= 1
        and "Try again" in r.json()["detail"]
    )
    assert _login(client, "alice", "wonderland").status_code == 429  # not even checked yet
    assert _login(client, " alice ", "wonderland").status_code == 429  # same name as Gradio sees it
    clock.t += 1.5
    assert _login(client, "alice", "wrong again").status_code == 400
    assert _login(client, "alice", "wonderland").status_code == 429  # now 2 s
    clock.t += 2.5
    r = _login(client, "alice", "wonderland")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert _login(client, "alice", "typo").status_code == 400  # success reset the count


def test_multipart_login_form_is_throttled_by_its_user_name(login_app):
    client, _ = login_app
    boundary = "----formboundary7MA4YWxk"

    def multipart(user, password):
        parts = "".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
            for k, v in (("username", user), ("password", password))
        )
        return client.post(
            "/login",
            content=(parts + f"--{boundary}--\r\n").encode(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )

    assert [multipart("alice", f"bad{i}").status_code for i in range(5)] == [400] * 5
    assert multipart("alice", "wonderland").status_code == 429
    assert _login(client, "alice", "wonderland").status_code == 429  # same key either way
    assert multipart("bob", "x").status_code == 400  # another user: not locked


def test_docs_need_login_or_are_gone(login_app):
    client, _ = login_app
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404
    assert _login(client, "alice", "wonderland").status_code == 200
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404
