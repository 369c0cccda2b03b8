"""The memory dashboard in real headless Chromium against `python app.py`: start 4 demo users,
see shared cells with ref_count >= 4 appear, highlight one conversation, stop them, see every
block return to free / cached-free. Saves docs/dashboard.png."""
import re
import time

import pytest

from tests.e2e.polling import wait_until
from gradio_client import Client

from loadgen.demo_load import DEFAULT_SYSTEM_PROMPT

pytestmark = pytest.mark.slow

SHARED_CELLS = "els => els.map(e => [+e.textContent, e.title])"




def test_demo_users_share_blocks_then_release_them(launch, screenshot_dir):
    from playwright.sync_api import sync_playwright
    server = launch(args=["--num-blocks", "1024", "--max-model-len", "2048"])
    # a ~160-token shared system prompt: ~10 full blocks every demo user shares
    Client(server.url, verbose=False).predict(DEFAULT_SYSTEM_PROMPT, api_name="/set_shared_prompt")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url)
            page.get_by_role("tab", name="Memory").click()
            wait_until(lambda: page.locator("#kv-grid i").count() == 1024, 30, what="the grid")
            assert "1,024 blocks, one cell per block" in page.inner_text("#kv-grid")

            page.fill("#kv-demo-n input", "4")
            page.click("#kv-demo-start")
            shared = wait_until(lambda: [c for c in page.eval_on_selector_all("#kv-grid i.s", SHARED_CELLS)
                                         if c[0] >= 4], 90, what="shared cells with ref_count >= 4")
            assert len(shared) >= 8, shared
            ref = int(re.search(r"ref_count (\d+)", shared[0][1]).group(1))
            assert ref == shared[0][0] and len(re.findall(r"demo-\d+-\d+", shared[0][1])) == ref
            wait_until(lambda: "4 simulated users chatting" in page.inner_text("#kv-demo-status"), 10,
                       what="the demo status")
            snap = server.kv()
            assert sum(1 for r in snap["blocks"]["ref_count"] if r >= 4) >= 8

            # highlight one demo user's blocks and show its block table
            page.click("#kv-select input")
            option = page.locator("#kv-select li[role=option]").filter(has_text="demo-").first
            name = option.get_attribute("aria-label")
            option.click()
            wait_until(lambda: f"Block table of {name}" in page.inner_text("#kv-tables"), 15,
                       what="the selected block table")
            wait_until(lambda: page.locator("#kv-grid i.h").count() >= 12, 10, what="highlighted cells")
            wait_until(lambda: "%" in page.inner_text("#kv-headline"), 10, what="headline numbers")
            time.sleep(6)                                   # let the timeline plots draw a few points
            page.locator("#kv-dashboard").screenshot(path=str(screenshot_dir / "dashboard.png"))

            page.click("#kv-demo-stop")
            wait_until(lambda: page.locator("#kv-grid i.p, #kv-grid i.s").count() == 0, 60,
                       what="every block back to free / cached")
            assert page.locator("#kv-grid i.c").count() >= 8       # the shared prefix stays cached
            assert "stopped" in page.inner_text("#kv-demo-status")
            st = server.kv()["stats"]
            assert st["used_blocks"] == 0 and st["cached_blocks"] >= 8
            assert errors == []
        finally:
            browser.close()
