"""`app.py --backend URL` on a second, real `app.py` (the backend loads the model; the front loads
none): chat, multi-turn, stop, and the Memory tab's remote view, through gradio_client and Chromium.

What is checked on the backend's side, through its own /api/kv: a stopped reply's request is gone
(the hang-up aborted it), and the front keeps no sessions there (nothing runs or stays parked
between turns); the second turn's prompt hits the backend's prefix cache, reported back through
usage.prompt_tokens_details.cached_tokens into the reply's stored stats.
"""

from __future__ import annotations

import time

import httpx
import pytest
from gradio_client import Client

from tests.e2e.conftest import AppServer
from tests.e2e.polling import wait_until
from tests.e2e.browser import launch_chromium

pytestmark = pytest.mark.slow

BACKEND_BLOCKS = 512
SYSTEM = "You are a concise assistant. Answer in one short sentence, and never make anything up."


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backend")
    backend = AppServer(
        tmp / "backend.db",
        ["--num-blocks", str(BACKEND_BLOCKS), "--max-model-len", "1024"],
        tmp / "backend.log",
    )
    front = None
    try:
        backend.wait_ready(timeout=300)
        front = AppServer(
            tmp / "front.db", ["--backend", backend.url], tmp / "front.log"
        ).wait_ready()
        yield backend, front
    finally:
        if front is not None:
            front.kill()
        backend.kill()


def _rows(api, db, conv):
    return api.read_db(
        db,
        "SELECT m.role, m.content, m.status, s.cached_tokens, s.prompt_tokens, s.ttft_s "
        "FROM messages m LEFT JOIN reply_stats s ON s.message_id = m.id "
        "WHERE m.conversation_id = ? ORDER BY m.id",
        (conv,),
    )


def test_chat_multi_turn_and_stop_on_a_remote_app(pair, chat_api):
    backend, front = pair
    api = chat_api
    c = Client(front.url, verbose=False)
    c.predict(SYSTEM, api_name="/set_shared_prompt")
    question = "What is the capital of France?"
    out = c.predict(question, *api.sampling(max_tokens=24), api_name="/send")
    conv = api.conversation_id(out)
    first = api.reply_text(out)
    assert first and "could not answer" not in first and "prompt tokens from cache" in first
    # greedy: the same text the backend's own /v1 gives for the same messages
    model = httpx.get(backend.url + "v1/models").json()["data"][0]["id"]
    direct = httpx.post(
        backend.url + "v1/chat/completions",
        timeout=120,
        json={
            "model": model,
            "max_tokens": 24,
            "temperature": 0.0,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ],
        },
    ).json()
    stored = [r for r in _rows(api, front.db, conv) if r["role"] == "assistant"][0]["content"]
    assert stored == direct["choices"][0]["message"]["content"]

    out = c.predict("And of Germany?", *api.sampling(max_tokens=24), api_name="/send")
    assert "could not answer" not in api.reply_text(out)
    rows = _rows(api, front.db, conv)
    assert [r["role"] for r in rows if r["role"] != "system"] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    second = [r for r in rows if r["role"] == "assistant"][1]
    assert second["status"] == "complete" and second["ttft_s"] > 0
    # the full conversation was resent; the backend's prefix cache found the first turn's blocks
    assert second["cached_tokens"] >= 16 and second["prompt_tokens"] > second["cached_tokens"]
    snap = backend.kv()
    assert (
        snap["stats"]["running"] == 0 and snap["stats"]["num_idle_sessions"] == 0
    )  # no remote sessions

    # n = 2 alternatives: one request with n=2; the stream's two indices fill the two columns
    out = c.predict(
        *api.sampling(max_tokens=8, n=2, temperature=1.0, seed=7), api_name="/regenerate"
    )
    alts = [o for o in out[4:] if isinstance(o, dict) and o.get("visible")]
    assert len(alts) == 2 and all("Alternative" in a["value"] for a in alts), out[4:]
    # each column got its own text and its own finish (stats line with a token count)
    assert all(" token" in a["value"] and "stopped" not in a["value"] for a in alts), alts
    assert backend.kv()["stats"]["running"] == 0

    # Stop mid-reply: the front hangs up, the backend aborts the request and frees its blocks.
    job = c.submit(
        "Tell me a very long story about bread.", *api.sampling(max_tokens=600), api_name="/send"
    )
    api.wait_for(lambda: api.streaming_text(job), timeout=120)
    assert backend.kv()["stats"]["running"] == 1
    time.sleep(0.5)
    job.cancel()
    last = api.wait_for(
        lambda: [r for r in _rows(api, front.db, conv)[-1:] if r["status"] == "stopped"], timeout=30
    )[0]
    assert last["content"]
    snap = backend.wait_kv(
        lambda s: (
            s["stats"]["running"] == 0 and s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"]
        ),
        timeout=60,
    )
    assert (
        snap["stats"]["running"] == 0
        and snap["stats"]["used_blocks"] == snap["stats"]["pinned_blocks"]
    ), snap["sequences"]
    c.close()


def test_browser_chat_and_the_remote_memory_view(pair, screenshot_dir):
    from playwright.sync_api import sync_playwright

    backend, front = pair
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(front.url)
            page.fill("#msg textarea", "Say hello in French.")
            page.keyboard.press("Enter")
            wait_until(
                lambda: "prompt tokens from cache" in page.inner_text("#chatbot"),
                120,
                what="the reply with its stats line",
            )
            page.get_by_role("tab", name="Memory").click()

            def blocks_drawn() -> int:  # one <i> per cell; long free runs are one counted band
                return page.evaluate("""() => [...document.querySelectorAll('#kv-grid i')].reduce(
                    (n, el) => n + (el.dataset.band ? parseInt(el.dataset.band) : 1), 0)""")

            wait_until(
                lambda: blocks_drawn() == BACKEND_BLOCKS, 30, what="the backend's block grid"
            )
            head = page.inner_text("#kv-remote-head").lower()
            assert "vllm" in head and "kv-cache usage" in head  # app.py exports vLLM's names
            assert "what this page cannot see" in head
            assert "another app.py" in page.inner_text("#kv-remote-grid-note")
            for plot in (
                "#kv-remote-pct",
                "#kv-remote-reqs",
                "#kv-remote-tps",
            ):  # the last two with a y_lim update
                wait_until(
                    lambda: page.locator(f"{plot} svg, {plot} canvas").count() > 0,
                    30,
                    what=f"the timeline {plot}",
                )
            page.screenshot(path=str(screenshot_dir / "dashboard_remote.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
