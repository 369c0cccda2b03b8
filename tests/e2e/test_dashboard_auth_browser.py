"""Two users under --auth: bob's Memory tab and /api/kv show none of alice's ids or titles (only an
anonymous count), /api/kv needs a login, and alice saving her own shared prompt leaves bob's new
chats on the app's default."""

import json
import urllib.error
import urllib.request

import pytest
from gradio_client import Client

from storage.presets import DEFAULT_SYSTEM_PROMPT
from tests.e2e.polling import wait_until
from tests.e2e.browser import launch_chromium

pytestmark = pytest.mark.slow

PROMPT_OF = (
    "SELECT p.text FROM conversations c JOIN system_prompts p ON p.id = c.system_prompt_id "
    "WHERE c.id = ?"
)


def test_bob_sees_nothing_of_alice(launch, chat_api):
    from playwright.sync_api import sync_playwright

    api = chat_api
    server = launch(
        args=[
            "--num-blocks",
            "1024",
            "--max-model-len",
            "4096",
            "--auth",
            "alice:wonderland",
            "--auth",
            "bob:builder",
        ]
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "api/kv", timeout=10)
    assert e.value.code == 401
    alice = Client(server.url, auth=("alice", "wonderland"), verbose=False)
    alice.predict(
        "You are a pirate. Always answer like a pirate would, with many arrs.",
        api_name="/set_shared_prompt",
    )
    out = alice.predict("Trip to Lisbon plans", *api.sampling(max_tokens=4), api_name="/send")
    conv = api.conversation_id(out)
    assert api.read_db(server.db, PROMPT_OF, (conv,))[0]["text"].startswith("You are a pirate")
    bob = Client(server.url, auth=("bob", "builder"), verbose=False)
    bob_conv = api.conversation_id(
        bob.predict("Bob's question", *api.sampling(max_tokens=4), api_name="/send")
    )
    assert api.read_db(server.db, PROMPT_OF, (bob_conv,))[0]["text"] == DEFAULT_SYSTEM_PROMPT

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(server.url)
            page.fill("input[type=text]", "bob")
            page.fill("input[type=password]", "builder")
            page.get_by_role("button", name="Login").click()
            page.get_by_role("tab", name="Memory").click()
            wait_until(
                lambda: "other chat" in page.inner_text("#kv-story"), 60, what="the anonymous count"
            )
            html = page.inner_html("#kv-dashboard")
            assert conv not in html and "Lisbon" not in html and "alice" not in html
            wait_until(
                lambda: "another user (1)" in page.inner_text("#kv-who"),
                60,
                what="alice, anonymous",
            )
            assert "you (bob)" in page.inner_text("#kv-who")  # "who is served": own row by name
            metrics = server.get("metrics")  # open endpoint: aggregates only (issue 48.6)
            assert (
                "alice" not in metrics
                and "bob" not in metrics
                and "paged_chat_tenant_" not in metrics
            )
            assert "vllm:num_requests_running" in metrics
            assert "Bob" in page.inner_text("#kv-tables")  # his own chat, by title
            kv = json.loads(page.evaluate("() => fetch('/api/kv').then(r => r.text())"))
            text = json.dumps(kv)
            assert conv not in text and "Lisbon" not in text and "alice" not in text
            assert [s["session_id"] for s in kv["sequences"]] == [bob_conv]
            assert kv["others"]["chats"] >= 1
            # #12.4: demo users are for the local user or an --admin; bob is neither
            page.click("#kv-demo-start button, button#kv-demo-start")
            wait_until(
                lambda: "Only the local user or an admin" in page.inner_text("body"),
                30,
                what="the refusal",
            )
            page.wait_for_timeout(1500)
            assert "simulated users chatting" not in page.inner_text("#kv-demo-status")
            assert (
                json.loads(page.evaluate("() => fetch('/api/kv').then(r => r.text())"))["stats"][
                    "running"
                ]
                == 0
            )
            # issue 47: who is signed in, and a way out
            page.get_by_role("tab", name="Chat").click()
            assert "Signed in as bob" in page.inner_text("#signed-in")
            page.click("#log-out")
            page.wait_for_selector("input[type=password]", timeout=60_000)  # the login page again
            status = page.evaluate("() => fetch('/api/kv').then(r => r.status)")
            assert status == 401  # the login is gone
        finally:
            browser.close()
    for c in (alice, bob):
        c.close()
