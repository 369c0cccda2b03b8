"""Issue #29 items 1, 6, 7 against a real `python app.py --auth ... --api-key ...` process.

Each attack comes from its own client address (X-Forwarded-For through `--trusted-proxy 127.0.0.1`),
so one test's throttle state cannot decide another's; the cross-site page is real Chromium on
`http://localhost:<port>` firing no-cors requests at `http://127.0.0.1:<app port>`."""

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from routes.security.login_guard import ADDRESS_FREE_FAILURES, DEVICE_COOKIE
from tests.e2e.conftest import AppServer
from tests.e2e.browser import launch_chromium, require_chromium

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "sk-issue-29"
BOUNDARY = "----e2eboundary29"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("login29")
    s = AppServer(
        tmp / "chat.db",
        [
            "--num-blocks",
            "64",
            "--max-model-len",
            "256",
            "--max-num-seqs",
            "2",
            "--auth",
            "alice:wonderland",
            "--auth",
            "bob:builder",
            "--api-key",
            KEY,
            "--trusted-proxy",
            "127.0.0.1",
        ],
        tmp / "app.log",
    )
    try:
        yield s.wait_ready()
    finally:
        s.kill()


def request(server, method, path, *, body=None, content_type=None, headers=None, address=None):
    """(status, body text, headers) of one raw HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    h = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    if address:
        h["X-Forwarded-For"] = address
    if content_type:
        h["Content-Type"] = content_type
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    out = (r.status, r.read().decode(errors="replace"), r.getheaders())
    conn.close()
    return out


def form(server, fields, *, multipart=False, address=None, cookie=None):
    if multipart:
        body = (
            "".join(
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                for k, v in fields
            )
            + f"--{BOUNDARY}--\r\n"
        )
        ctype = f"multipart/form-data; boundary={BOUNDARY}"
    else:
        body, ctype = urllib.parse.urlencode(fields), "application/x-www-form-urlencoded"
    headers = {"Cookie": cookie} if cookie else None
    return request(
        server,
        "POST",
        "/login",
        body=body.encode(),
        content_type=ctype,
        address=address,
        headers=headers,
    )


@pytest.mark.parametrize("multipart, address", [(False, "10.29.1.1"), (True, "10.29.1.2")])
def test_a_changing_first_username_never_gets_past_the_throttle(server, multipart, address):
    """#29.1: username=<new each try>&username=alice&password=guess was never throttled (40 tries,
    no 429) and the right password then gave a cookie. Now such a form is not a login at all."""
    codes = [
        form(
            server,
            [("username", f"decoy{i}"), ("username", "alice"), ("password", f"guess{i}")],
            multipart=multipart,
            address=address,
        )[0]
        for i in range(40)
    ]
    assert 200 not in codes
    assert codes[:ADDRESS_FREE_FAILURES] == [400] * ADDRESS_FREE_FAILURES
    assert set(codes[ADDRESS_FREE_FAILURES:]) == {429}
    # from a fresh address the trick with the right password does not log in either
    status, text, _ = form(
        server,
        [("username", "decoy"), ("username", "alice"), ("password", "wonderland")],
        multipart=multipart,
        address=address + "0",
    )
    assert status == 400 and "exactly one username" in text


def test_fresh_user_names_from_one_address_are_throttled(server):
    """#29.7: made-up names used to be checked (scrypt each) without end."""
    codes = [
        form(server, [("username", f"nobody-{i}"), ("password", "x")], address="10.29.2.1")[0]
        for i in range(ADDRESS_FREE_FAILURES + 5)
    ]
    assert codes[:ADDRESS_FREE_FAILURES] == [400] * ADDRESS_FREE_FAILURES
    assert set(codes[ADDRESS_FREE_FAILURES:]) == {429}
    assert (
        form(server, [("username", "bob"), ("password", "builder")], address="10.29.2.2")[0] == 200
    )


def test_a_device_cookie_keeps_alices_right_password_working(server):
    """#29.6: someone at alice's address fails her login until it is throttled; her browser, which
    logged in before, still gets in with the right password."""
    address = "10.29.3.1"
    status, _, headers = form(
        server, [("username", "alice"), ("password", "wonderland")], address=address
    )
    assert status == 200
    device = next(
        v.split(";")[0]
        for k, v in headers
        if k.lower() == "set-cookie" and v.startswith(DEVICE_COOKIE)
    )
    for i in range(8):
        form(server, [("username", "alice"), ("password", f"wrong{i}")], address=address)
    assert (
        form(server, [("username", "alice"), ("password", "wonderland")], address=address)[0] == 429
    )
    assert (
        form(
            server,
            [("username", "alice"), ("password", "wonderland")],
            address=address,
            cookie=device,
        )[0]
        == 200
    )


@pytest.fixture
def evil_page():
    """A page on http://localhost:<port> (another site than 127.0.0.1) that fires no-cors requests."""
    html = {"body": b""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html["body"])

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://localhost:{srv.server_address[1]}/", html
    finally:
        srv.shutdown()


def test_a_cross_site_page_cannot_lock_the_local_user_out(server, evil_page):
    """#29.6: 45 no-cors logins and 45 wrong-key calls from another site's page raised the wait of
    127.0.0.1, so the user's right key got 429 (44 of 45) and alice's login too, even after the
    page closed. Now they are refused as cross-site and count for nobody."""
    require_chromium()
    from playwright import sync_api

    url, html = evil_page
    target = f"http://127.0.0.1:{server.port}"
    html["body"] = f"""<!doctype html><html><body><script>
    window.fired = 0;
    (async () => {{
      for (let i = 0; i < 45; i++) {{
        const body = new URLSearchParams({{username: "alice", password: "guess" + i}});
        await fetch("{target}/login", {{method: "POST", mode: "no-cors", body}}).catch(() => null);
        await fetch("{target}/v1/models", {{mode: "no-cors", headers: {{}}}}).catch(() => null);
        await fetch("{target}/v1/chat/completions", {{method: "POST", mode: "no-cors",
              body: JSON.stringify({{model: "x", messages: []}})}}).catch(() => null);
        window.fired++;
      }}
    }})();
    </script></body></html>""".encode()
    with sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("window.fired >= 45", timeout=120_000)
        finally:
            browser.close()
    for _ in range(5):  # the local user's own tools, after the page closed
        status, text, _ = request(
            server, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"}
        )
        assert status == 200, text
    assert form(server, [("username", "alice"), ("password", "wonderland")])[0] == 200
    # the page's requests did arrive, and were refused as cross-site (not merely dropped)
    status, text, _ = request(
        server,
        "POST",
        "/login",
        body=b"username=alice&password=x",
        content_type="application/x-www-form-urlencoded",
        headers={"Origin": url.rstrip("/"), "Sec-Fetch-Site": "cross-site"},
    )
    assert status == 403 and "another site" in text
