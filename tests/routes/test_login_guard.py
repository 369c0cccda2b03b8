"""Issue #29 items 1, 6, 7 in process: Gradio's real /login route mounted as ui/layout.py mounts it,
our guard in front (routes/security/login_guard.py), the real scrypt. The throttle's clock is a test clock.
The same attacks against a real app process: tests/e2e/test_security_login_abuse.py."""

import asyncio
import hashlib
import threading
import time

import fastapi
import gradio as gr
import pytest
from fastapi.testclient import TestClient

from routes.security.auth import Credentials, LoginThrottle, hash_password
from routes.security.cross_site import foreign_origin
from routes.security.hash_budget import HashBudget
from routes.security.login_guard import ADDRESS_FREE_FAILURES, DEVICE_COOKIE, DeviceCookies
from routes.security.host_guard import install_security

BOUNDARY = "----formboundary29"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def login(monkeypatch):
    clock = Clock()
    creds = Credentials(
        {"alice": hash_password("wonderland"), "bob": hash_password("builder")},
        throttle=LoginThrottle(clock=clock),
        budget=HashBudget(share=1.0),
    )
    app = fastapi.FastAPI()
    with gr.Blocks() as demo:
        gr.Markdown("private")
    app = gr.mount_gradio_app(app, demo, path="/", auth=creds.gradio_auth, ssr_mode=False)
    install_security(app, "127.0.0.1", (), auth=creds.gradio_auth)
    with TestClient(app, base_url="http://127.0.0.1:7860") as client:
        yield client, clock, creds


def urlencoded(client, fields, headers=None):
    body = "&".join(f"{k}={v}" for k, v in fields)
    return client.post(
        "/login",
        content=body.encode(),
        headers={"content-type": "application/x-www-form-urlencoded", **(headers or {})},
    )


def multipart(client, fields):
    parts = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in fields
    )
    return client.post(
        "/login",
        content=(parts + f"--{BOUNDARY}--\r\n").encode(),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )


@pytest.mark.parametrize("send", [urlencoded, multipart])
def test_a_changing_first_username_field_does_not_bypass_the_throttle(login, send):
    """The old bypass: username=<new each time>&username=alice&password=guess. Refused as a form,
    counted against the address; the plain form for alice is throttled as before."""
    client, clock, creds = login
    codes = [
        send(
            client, [("username", f"decoy{i}"), ("username", "alice"), ("password", f"g{i}")]
        ).status_code
        for i in range(ADDRESS_FREE_FAILURES + 3)
    ]
    assert codes[:ADDRESS_FREE_FAILURES] == [400] * ADDRESS_FREE_FAILURES
    assert set(codes[ADDRESS_FREE_FAILURES:]) == {429}
    assert creds.budget.hashes == 0  # none of them reached a password check
    r = send(client, [("username", "alice"), ("password", "wonderland"), ("password", "x")])
    assert r.status_code == 429  # the address waits; two passwords never pass


def test_two_password_fields_are_refused(login):
    client, _, _ = login
    r = urlencoded(client, [("username", "alice"), ("password", "x"), ("password", "wonderland")])
    assert r.status_code == 400 and "exactly one" in r.json()["detail"]


def test_fresh_names_from_one_address_are_throttled(login):
    """Unknown names cost no hash and count against the address (#29.7)."""
    client, clock, creds = login
    codes = [
        urlencoded(client, [("username", f"nobody{i}"), ("password", "x")]).status_code
        for i in range(ADDRESS_FREE_FAILURES + 2)
    ]
    assert codes[:ADDRESS_FREE_FAILURES] == [400] * ADDRESS_FREE_FAILURES
    assert codes[-1] == 429
    assert creds.budget.hashes == 0


def test_cross_site_requests_are_refused_and_count_for_nobody(login):
    client, clock, creds = login
    for i in range(30):
        r = urlencoded(
            client,
            [("username", "alice"), ("password", f"g{i}")],
            {"origin": "http://evil.example", "sec-fetch-site": "cross-site"},
        )
        assert r.status_code == 403
    r = urlencoded(
        client, [("username", "alice"), ("password", "x")], {"origin": "http://127.0.0.1:8000"}
    )  # another port, older browser: origin only
    assert r.status_code == 403
    assert creds.budget.hashes == 0
    r = urlencoded(
        client,
        [("username", "alice"), ("password", "wonderland")],
        {"origin": "http://127.0.0.1:7860", "sec-fetch-site": "same-origin"},
    )
    assert r.status_code == 200  # the login page itself still works


def test_a_device_cookie_keeps_the_right_password_working_while_the_address_is_throttled(login):
    client, clock, creds = login
    assert (
        urlencoded(client, [("username", "alice"), ("password", "wonderland")]).status_code == 200
    )
    device = client.cookies.get(DEVICE_COOKIE)
    assert device
    client.cookies.clear()
    for i in range(8):  # someone else at the same address
        urlencoded(client, [("username", "alice"), ("password", f"g{i}")])
    assert (
        urlencoded(client, [("username", "alice"), ("password", "wonderland")]).status_code == 429
    )
    client.cookies.set(DEVICE_COOKIE, device)
    assert (
        urlencoded(client, [("username", "alice"), ("password", "wonderland")]).status_code == 200
    )
    # the cookie is alice's: it buys bob nothing, and a forged one is ignored
    client.cookies.clear()
    client.cookies.set(DEVICE_COOKIE, device)
    for i in range(5):
        urlencoded(client, [("username", "bob"), ("password", f"g{i}")])
    assert urlencoded(client, [("username", "bob"), ("password", "builder")]).status_code == 429
    assert DeviceCookies().device_of(device, "alice") is None  # another process's secret


def test_foreign_origin_rules():
    def scope(**h):
        return {
            "scheme": "http",
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in h.items()],
        }

    host = "127.0.0.1:7860"
    assert foreign_origin(scope(host=host)) is None  # curl, SDKs
    assert foreign_origin(scope(host=host, origin="http://127.0.0.1:7860")) is None
    assert foreign_origin(scope(host=host, sec_fetch_site="same-origin", origin="http://x")) is None
    assert foreign_origin(scope(host=host, sec_fetch_site="cross-site"))
    assert foreign_origin(scope(host=host, sec_fetch_site="same-site"))  # another port
    assert foreign_origin(scope(host=host, origin="null"))
    assert foreign_origin(scope(host=host, origin="http://localhost:7860"))
    assert foreign_origin(scope(host="chat.lan", origin="http://chat.lan")) is None
    assert (
        foreign_origin(
            scope(host=host, origin="http://good.example", sec_fetch_site="cross-site"),
            allowed_origins=["http://good.example"],
        )
        is None
    )


def test_the_hash_budget_runs_one_hash_at_a_time_within_its_share(monkeypatch):
    """12 concurrent attempts: scrypt never runs twice at once, and its CPU time stays within the
    burst plus SHARE of the wall time (plus one hash). Unknown names never hash."""
    real = hashlib.scrypt
    live, peak, spans = [0], [0], []
    lock = threading.Lock()

    def spy(*a, **kw):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        t = time.thread_time()
        try:
            return real(*a, **kw)
        finally:
            with lock:
                live[0] -= 1
            spans.append(time.thread_time() - t)

    budget = HashBudget(share=0.25, burst_s=0.1)
    creds = Credentials({"alice": hash_password("wonderland")}, budget=budget)
    check = creds.gradio_auth
    monkeypatch.setattr(hashlib, "scrypt", spy)

    async def flood():
        start = time.perf_counter()
        tasks = [
            asyncio.create_task(check("alice" if i % 2 else f"ghost{i}", "bad")) for i in range(12)
        ]
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start

    results, wall = asyncio.run(flood())
    assert results == [False] * 12
    assert peak[0] == 1
    assert len(spans) == 6 == creds.budget.hashes  # only the six known-name attempts hashed
    assert sum(spans) <= budget.burst_s + 0.25 * wall + max(spans)
    assert budget.cpu_spent_s == pytest.approx(sum(spans), rel=0.2, abs=0.02)
    assert asyncio.run(check("alice", "wonderland")) is True
