"""The Memory tab in real headless Chromium against `python app.py`: the pinned shared prompt shows
as its own state and stays after every chat closes; demo users appear by title, never by id; the
headline's numbers equal /api/kv; the timer sends nothing while the Chat tab is shown; dark-mode
colours. Saves docs/dashboard.png (the README's screenshot)."""
import re
import time

import pytest

from tests.e2e.polling import wait_until
from ui.dashboard.panels import DARK, LIGHT

pytestmark = pytest.mark.slow

HEADLINE = "els => Object.fromEntries(els.map(e => [e.dataset.k, e.dataset.v]))"


def ticks_served(server) -> int:
    """The app's count of Memory-tab ticks (one per tick request it answered), from /metrics."""
    return int(re.search(r"^paged_chat_dashboard_ticks_total (\d+)", server.get("metrics"), re.M).group(1))


def rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb(%d, %d, %d)" % tuple(int(h[i:i + 2], 16) for i in (0, 2, 4))


def test_pinned_prompt_titles_headline_timer_and_theme(launch, screenshot_dir):
    from playwright.sync_api import sync_playwright
    server = launch(args=["--num-blocks", "1024", "--max-model-len", "4096"])
    snap = server.wait_kv(lambda s: s.get("pins"), timeout=120)
    pinned = snap["pins"][0]["block_table"]
    assert snap["pins"][0]["name"] == "shared" and len(pinned) >= 30     # the ~550-token default
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url)
            page.wait_for_selector("#chatbot")
            before = ticks_served(server)
            time.sleep(4)                                    # Chat tab shown: the timer is off
            assert ticks_served(server) == before

            page.get_by_role("tab", name="Memory").click()
            wait_until(lambda: page.locator("#kv-grid i.n").count() == len(pinned), 30, what="pinned cells")
            wait_until(lambda: ticks_served(server) >= before + 3, 15, what="ticks while the Memory tab is shown")
            assert "pinned for the shared system prompt" in page.inner_text("#kv-story")
            assert rgb(LIGHT["pinned"]) == page.eval_on_selector("#kv-grid i.n", "e => getComputedStyle(e).backgroundColor")

            page.fill("#kv-demo-n input", "8")
            page.click("#kv-demo-start")
            wait_until(lambda: "8 chats hold" in page.inner_text("#kv-story"), 120, what="8 demo chats")
            time.sleep(5)                                    # a few points on the timeline
            page.locator("#kv-dashboard").screenshot(path=str(screenshot_dir / "dashboard.png"))
            saved = float(page.eval_on_selector_all("#kv-story [data-k]", HEADLINE)["saved_frac"])
            assert saved >= 0.5, saved
            tables = page.inner_text("#kv-tables")
            assert "demo user" in tables and not re.search(r"demo-\d+-\d+", tables)   # titles, not ids
            page.click("#kv-select input")
            options = page.locator("#kv-select li[role=option]").all_inner_texts()
            assert options and all(not re.search(r"demo-\d+-\d+", o) for o in options)

            page.click("#kv-demo-stop")
            wait_until(lambda: server.kv()["stats"]["num_idle_sessions"] + server.kv()["stats"]["running"] == 0,
                       60, what="every demo session ended")
            st = server.kv()["stats"]
            wait_until(lambda: "No chats are open yet" in page.inner_text("#kv-story"), 15, what="no chats")
            got = page.eval_on_selector_all("#kv-story [data-k]", HEADLINE)
            assert int(got["total_blocks"]) == st["total_blocks"]
            assert int(got["pinned_blocks"]) == st["pinned_blocks"] == len(pinned)
            tiles = page.eval_on_selector_all("#kv-headline [data-k]", HEADLINE)
            assert int(tiles["used_blocks"]) == st["used_blocks"] == len(pinned)   # only the pin is held
            assert int(tiles["shared_blocks"]) == st["shared_blocks"]
            assert page.locator("#kv-grid i.n").count() == len(pinned)           # the pin stays

            page.get_by_role("tab", name="Chat").click()
            time.sleep(1.5)
            n = ticks_served(server)
            time.sleep(4)
            assert ticks_served(server) == n, "the timer kept running while the Memory tab was hidden"

            dark = browser.new_page(viewport={"width": 1360, "height": 900})
            dark.goto(server.url + "?__theme=dark")
            dark.get_by_role("tab", name="Memory").click()
            wait_until(lambda: dark.locator("#kv-grid i.n").count() == len(pinned), 30, what="dark grid")
            assert rgb(DARK["pinned"]) == dark.eval_on_selector("#kv-grid i.n", "e => getComputedStyle(e).backgroundColor")
            assert errors == []
        finally:
            browser.close()
