"""More concurrent streaming chats than Gradio has worker threads (40): the async handlers hold
none while they wait, so all of them stream at once, and closing them releases every block."""

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow

USERS = 44


def test_44_concurrent_streaming_chats(launch, chat_api):
    api = chat_api
    server = launch(args=["--num-blocks", "1024", "--max-model-len", "512", "--max-num-seqs", "64"])
    with ThreadPoolExecutor(8) as ex:
        clients = list(ex.map(lambda _: Client(server.url, verbose=False), range(USERS)))
    jobs = [
        c.submit(f"Say hello to user number {i}.", *api.sampling(max_tokens=16), api_name="/send")
        for i, c in enumerate(clients)
    ]
    peak = 0
    deadline = time.time() + 180
    while not all(j.done() for j in jobs) and time.time() < deadline:
        with urllib.request.urlopen(server.url + "api/kv", timeout=10) as r:
            stats = json.load(r)["stats"]
        peak = max(peak, stats["running"] + stats["waiting"])
        time.sleep(0.1)
    results = [j.result(timeout=60) for j in jobs]
    assert peak > 32, f"only {peak} requests were ever live at once"
    assert all("prompt tokens from cache" in api.reply_text(r) for r in results)
    assert len({api.conversation_id(r) for r in results}) == USERS
    with ThreadPoolExecutor(8) as ex:
        assert set(ex.map(lambda c: c.predict(api_name="/close_tab"), clients)) == {"closed"}
    snap = server.wait_kv(lambda s: s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"])
    assert (
        snap["stats"]["used_blocks"] == snap["stats"]["pinned_blocks"] and snap["sequences"] == []
    )
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda c: c.close(), clients))
