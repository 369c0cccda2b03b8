"""The cluster Memory tab in Chromium: one app on two OpenAI servers (fake_backend.py)
whose KV-event streams are replica A's and B's recorded vLLM batches, served over real ZMQ by
tests/backends/kv_publisher.py. The app reads them by replay on connect, then live.

Checked in one page: the reply line names the replica that served the turn; the tab's headline and
per-replica counts equal the reader's model of the same bytes built here; the shared system prompt
is named by its first words; the landings table lists the turn; a clear-all event and a malformed
message arriving live are applied and counted without breaking the page.
"""

from __future__ import annotations

import pytest

from backends.kv_cluster import Replica, cluster_numbers
from backends.kv_events import Cleared, Removed
from tests.backends.fake_backend import FakeBackend
from tests.backends.kv_publisher import FakePublisher
from tests.backends.helpers import A, B, batches, first_index, run
from tests.e2e.browser import launch_chromium
from tests.e2e.conftest import AppServer
from tests.e2e.polling import wait_until
from tests.e2e.helpers import REPLICA_COUNTS

pytestmark = pytest.mark.slow


CACHE_INFO = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
    'kv_cache_memory_bytes="117964800",num_gpu_blocks="40",num_gpu_blocks_override="None"} 1.0\n'
)


def expected(parts):
    reps = []
    for name, items in parts:
        r = Replica(name, None, None)
        r.has_events, r.feed = True, run(items)
        r.blocks = r.feed.blocks
        reps.append(r)
    return cluster_numbers([r.snap() for r in reps])


def test_cluster_tab_draws_both_replicas_from_their_event_streams(tmp_path, screenshot_dir):
    from playwright.sync_api import sync_playwright

    from engine.exec.loader import resolve_hf_folder

    a, b = batches(A), batches(B)
    a, b_live = a[: first_index(a, Removed)], b[first_index(b, Cleared) :]
    b = b[: first_index(b, Cleared)]
    fakes = [FakeBackend(extra_metrics=CACHE_INFO).start() for _ in range(2)]
    pubs = [FakePublisher(), FakePublisher()]
    for pub, items in zip(pubs, (a, b)):
        for seq, payload in items:
            pub.publish(seq, payload)  # before the app listens: it replays them
    names = [f.url.split("//")[1] for f in fakes]
    args = [x for f in fakes for x in ("--backend", f.url)]
    args += [x for p in pubs for x in ("--backend-kv-events", p.spec)]
    args += ["--backend-tokenizer", resolve_hf_folder(None)[1]]
    app = AppServer(tmp_path / "front.db", args, tmp_path / "front.log")
    want = expected(zip(names, (a, b)))
    try:
        app.wait_ready()
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                page = browser.new_page(viewport={"width": 1360, "height": 1000})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(app.url)
                page.fill("#msg textarea", "When do you open?")
                page.keyboard.press("Enter")
                line = wait_until(
                    lambda: next(
                        (
                            t
                            for t in page.locator("#chatbot").all_inner_texts()
                            if "prompt tokens from cache on" in t
                        ),
                        None,
                    ),
                    60,
                    what="the reply's stats line",
                )
                assert any(
                    f"reused 8 of 12 prompt tokens from cache on {n}" in line for n in names
                ), line

                page.get_by_role("tab", name="Memory").click()
                head = "#kv-cluster-head"
                wait_until(
                    lambda: page.locator(f"{head} [data-k=held_blocks]").count(),
                    30,
                    what="the headline",
                )
                v = page.evaluate(f"""() => Object.fromEntries([...document.querySelectorAll(
                    '{head} [data-v]')].map(e => [e.dataset.k, e.dataset.v]))""")
                assert int(v["held_blocks"]) == want.held_blocks
                assert int(v["avoidable_blocks"]) == want.avoidable_blocks > 0
                assert (
                    int(v["top_tokens"]) == want.shared[0].tokens_on_all and v["top_copies"] == "2"
                )
                assert int(v["avoidable_bytes"]) == want.avoidable_blocks * 117964800 // 40
                text = page.inner_text(head)
                assert (
                    "You are a careful assistant" in text and "is held by both replicas" in text
                ), text
                counts = lambda: page.evaluate(REPLICA_COUNTS)
                assert counts() == {n: r.blocks for n, r in zip(names, want.replicas)}
                cells = page.locator("#kv-cluster-reps .kvcg i")
                assert cells.count() == 80  # 2 pools of 40 blocks, a cell each
                land = page.inner_text("#kv-cluster-land")
                assert any(n in land for n in names) and "What KV events cannot say" in land
                assert "Prefixes cached on several replicas" in page.inner_text(
                    "#kv-cluster-prefixes"
                )
                page.screenshot(path=str(screenshot_dir / "dashboard_cluster.png"), full_page=True)

                # live: junk on B's wire, then B's prefix-cache reset
                pubs[1].send_raw([b"", b"\x00", b"junk"])
                for seq, payload in b_live:
                    pubs[1].publish(seq, payload)
                wait_until(lambda: counts()[names[1]] == 0, 30, what="the clear-all on replica B")
                rep = page.inner_text(f'#kv-cluster-reps [data-replica="{names[1]}"]')
                assert "1 clear-all event" in rep and "1 malformed message skipped" in rep, rep
                assert counts()[names[0]] == want.replicas[0].blocks
                assert not errors, errors
            finally:
                browser.close()
    finally:
        app.kill()
        for x in (*pubs, *fakes):
            (x.close if isinstance(x, FakePublisher) else x.stop)()
