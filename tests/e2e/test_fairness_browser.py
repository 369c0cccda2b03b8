"""The Memory tab's "who is served" panel in a real browser: an API key floods the server while the
local user chats; the panel shows both tenants (running / waiting, share of tokens, counter,
preemptions), the event feed says the scheduler held the flooding key back, and /metrics carries
the per-tenant lines. Saves docs/dashboard-who.png with UPDATE_SCREENSHOTS=1."""

import threading

import pytest

from tests.e2e.polling import wait_until
from tests.e2e.browser import launch_chromium

pytestmark = pytest.mark.slow


def test_who_is_served_panel_shows_the_flood_held_back(launch, chat_api, screenshot_dir):
    import openai
    from gradio_client import Client
    from playwright.sync_api import sync_playwright

    server = launch(
        args=[
            "--num-blocks",
            "512",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "2",
            "--api-key",
            "batch-job:s3cret",
        ]
    )
    client = openai.OpenAI(base_url=server.url + "v1", api_key="s3cret", max_retries=0, timeout=600)
    model_id = client.models.list().data[0].id
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            try:
                client.completions.create(
                    model=model_id,
                    prompt="Write a very long story about ships.",
                    max_tokens=160,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
            except openai.APIError:
                pass

    floods = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for t in floods:
        t.start()
    chat_done = []

    def chat():
        c = Client(server.url, verbose=False)
        for k in range(2):
            c.predict(
                f"Hello number {k}, how are you?",
                *chat_api.sampling(max_tokens=24),
                api_name="/send",
            )
        chat_done.append(True)
        c.close()

    try:
        wait_until(
            lambda: server.kv()["stats"]["running"] == 2, 120, what="the flood to fill both slots"
        )
        chatter = threading.Thread(target=chat, daemon=True)
        chatter.start()
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                page = browser.new_page(viewport={"width": 1360, "height": 1000})
                page.goto(server.url)
                page.get_by_role("tab", name="Memory").click()
                wait_until(
                    lambda: (
                        "API key 'batch-job'" in page.inner_text("#kv-who")
                        and "you (this machine)" in page.inner_text("#kv-who")
                    ),
                    120,
                    what="both tenants in the panel",
                )
                wait_until(
                    lambda: "scheduler" in page.inner_text("#kv-feed"),
                    120,
                    what="a scheduler line in the event feed",
                )
                feed = page.inner_text("#kv-feed")
                assert "API key 'batch-job'" in feed and (
                    "held" in feed or "paused a reply" in feed
                )
                row = page.locator("#kv-who tr[data-tenant=\"API key 'batch-job'\"]")
                cells = row.locator("td").all_inner_texts()
                assert int(cells[1]) + int(cells[2]) >= 1  # the flood runs or waits
                assert "s3cret" not in page.inner_html("#kv-dashboard")
                who, fd = (
                    page.locator("#kv-who").bounding_box(),
                    page.locator("#kv-feed").bounding_box(),
                )
                page.screenshot(
                    path=str(screenshot_dir / "dashboard-who.png"),
                    full_page=True,
                    clip={
                        "x": who["x"],
                        "y": who["y"],
                        "width": max(who["width"], fd["width"]),
                        "height": fd["y"] + min(fd["height"], 260) - who["y"],
                    },
                )
                chatter.join(timeout=300)
                assert chat_done, "the local chat never finished while the API flood ran"
            finally:
                browser.close()
        metrics = server.get("metrics", timeout=10)
        assert 'paged_chat_tenant_generation_tokens_total{tenant="batch-job"}' in metrics
        assert 'paged_chat_tenant_queue_time_seconds_count{tenant="local"}' in metrics
        assert "s3cret" not in metrics
    finally:
        stop.set()
