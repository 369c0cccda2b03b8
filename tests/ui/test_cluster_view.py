"""The cluster Memory tab's words (ui/dashboard/cluster_view.py): the headline's form and numbers,
prefix names under --auth, the grid's cells, the landings table, escaping of decoded text."""

from __future__ import annotations

import html
import re

from backends.kv_cluster import ClusterNumbers, ReplicaSnap, RootSnap, SharedPrefix
from ui.dashboard import cluster_view as V

MiB3 = 3 * 2**20


def snap(name, blocks, copied, roots=(), pool=40, events=True, **kw):
    return ReplicaSnap(
        name,
        events,
        blocks=blocks,
        copied_blocks=copied,
        pool_blocks=pool,
        block_size=128,
        block_bytes=MiB3,
        roots=list(roots),
        kv_usage=0.25,
        **kw,
    )


def numbers(n_replicas=3, copies=3):
    g = SharedPrefix(
        0xABCDEF0123,
        [1, 2, 3],
        ("user:alice",),
        [f"r{i}" for i in range(copies)],
        copies,
        blocks_on_all=4,
        tokens_on_all=512,
        avoidable_blocks=4 * (copies - 1),
        avoidable_tokens=512 * (copies - 1),
    )
    roots = [RootSnap(0xABCDEF0123, 6, 768, [1, 2, 3], ("user:alice",), copied=4)]
    reps = [
        snap(f"r{i}", 10, 4 if i < copies else 0, roots if i < copies else ())
        for i in range(n_replicas)
    ]
    return ClusterNumbers(
        reps,
        unique_blocks=30 - 4 * (copies - 1),
        held_blocks=30,
        avoidable_blocks=4 * (copies - 1),
        avoidable_tokens=512 * (copies - 1),
        shared=[g],
    )


def values(html: str) -> dict:
    return dict(re.findall(r'data-k="(\w+)" data-v="([^"]*)"', html))


def test_headline_has_the_local_tabs_form_and_its_numbers():
    num = numbers()
    html = V.headline_sentence(num, lambda g: "“You are a helpful…”")
    text = re.sub("<[^>]+>", "", html)
    assert text.startswith(
        "One 512-token prefix (“You are a helpful…”) is held by all 3 replicas: 3 copies, "
        "2 of them a router could avoid."
    ), text
    assert "The 3 replicas cache 30 blocks; 8 (24.0 MiB) of them are copies" in text
    v = values(html)
    assert v["top_tokens"] == "512" and v["top_copies"] == "3" and v["avoidable_blocks"] == "8"
    assert int(v["avoidable_bytes"]) == 8 * MiB3

    num = numbers(n_replicas=3, copies=2)
    text = re.sub("<[^>]+>", "", V.headline_sentence(num, lambda g: "x"))
    assert "is held by 2 of the 3 replicas: 2 copies, 1 of them a router could avoid" in text
    num = numbers(n_replicas=2, copies=2)
    assert "is held by both replicas: 2 copies, 1 of them" in re.sub(
        "<[^>]+>", "", V.headline_sentence(num, str)
    )


def test_headline_without_events_one_replica_or_no_copies():
    num = ClusterNumbers([snap("r0", 0, 0, events=False)])
    assert "No KV events yet" in V.headline_sentence(num, str)
    num = ClusterNumbers([snap("r0", 5, 0)], held_blocks=5, unique_blocks=5)
    assert "nothing can be cached twice" in V.headline_sentence(num, str)
    num = ClusterNumbers([snap("r0", 5, 0), snap("r1", 5, 0)], held_blocks=10, unique_blocks=10)
    assert "none of them on more than one replica" in V.headline_sentence(num, str)


def test_prefix_words_only_for_the_viewer_under_auth_and_escaped():
    def decode(ids):
        return "<img src=x onerror=alert(1)> You are a librarian who answers questions about hours"

    mine = V.label([1], ("user:alice",), 0x1234, decode, "user:alice", auth=True)
    assert mine.startswith("“<img src=x") and mine.endswith("…”")  # 9 words, then …
    theirs = V.label([1], ("user:bob",), 0x1234, decode, "user:alice", auth=True)
    assert "librarian" not in theirs and "00001234" in theirs and "another user's" in theirs
    unsalted = V.label([1], (), 0x1234, decode, "user:alice", auth=True)
    assert "librarian" not in unsalted
    assert "librarian" in V.label([1], (), 0x1234, decode, None, auth=False)
    assert V.label(None, (), 0x1234, decode, None, auth=False) == "prefix 00001234"
    html = V.shared_table(numbers(), lambda g: mine)
    assert "<img" not in html and "&lt;img" in html
    html = V.replica_html(numbers().replicas[0], lambda r: mine)
    assert "<img" not in html


def test_grid_cells_add_up_to_the_pool_and_scale_down_big_pools():
    r = numbers().replicas[0]
    html = V.grid_html(r, lambda root: "p")
    cells = re.findall(r'<i class="(c[cpn])', html)
    assert cells.count("cp") == 4 and cells.count("cc") == 6 and cells.count("cn") == 30
    big = snap("big", 600_000, 100_000, pool=1_000_000)
    html = V.grid_html(big, lambda root: "p")
    per = int(re.search(r'data-per="(\d+)"', html).group(1))
    n = len(re.findall(r"<i ", html))
    assert n <= V.GRID_CELLS + 3 and per * V.GRID_CELLS >= 1_000_000


def test_replica_line_names_its_troubles_and_a_replica_without_events():
    r = snap(
        "r0",
        10,
        0,
        joined_late=True,
        counts={"gaps": 2, "lost_batches": 1, "malformed": 3},
        by_medium={"GPU": 8, "CPU": 2},
        kinds={"full_attention": 10},
        salted_blocks=4,
        last_event_age_s=12.0,
    )
    text = re.sub("<[^>]+>", "", V.replica_html(r, lambda root: "p"))
    assert (
        "By medium: GPU 8, CPU 2; by layer-group kind: full_attention 10; 4 under a cache salt"
        in text
    )
    assert "events/s, the last 12 s ago" in text
    assert "joined late" in text and "2 sequence gaps" in text and "1 batch lost" in text
    assert (
        "3 malformed messages skipped" in text
        and "KV usage (its /metrics): 25.0 % = 10 blocks" in text
    )
    text = re.sub("<[^>]+>", "", V.replica_html(snap("r1", 0, 0, events=False), lambda root: "p"))
    assert "No KV events for this replica" in text


def test_landings_table_shows_only_the_viewers_turns_under_auth():
    land = [
        {"replica": "gpu1:8000", "salt": "user:alice", "prompt_tokens": 300, "cached_tokens": 256},
        {"replica": "gpu2:8000", "salt": "user:bob", "prompt_tokens": 90, "cached_tokens": None},
    ]
    alice = V.landings_table(land, "user:alice", auth=True)
    assert "gpu1:8000" in alice and "gpu2:8000" not in alice and "256" in alice
    both = V.landings_table(land, None, auth=False)
    assert "gpu2:8000" in both and "not reported" in both
    assert "No chat turn" in V.landings_table(land, "user:carol", auth=True)


def test_the_tab_names_the_recorded_system_prompt_but_not_to_other_users_under_auth():
    """render() on the recorded vLLM streams (tests/backends/fixtures/kv_events/): the words come
    from the model's tokenizer.json; under --auth the unsalted prefix is shown by its hash only."""
    from backends.kv_cluster import Cluster, Replica
    from backends.kv_events import Cleared, Removed
    from engine.exec.loader import resolve_hf_folder
    from tests.backends.helpers import A, B, batches, first_index, run
    from tests.ui.fake_engine import request
    from ui.dashboard.cluster_tab import _Cached, render

    a, b = batches(A), batches(B)
    reps = []
    for name, items in (
        ("gpu1:8000", a[: first_index(a, Removed)]),
        ("gpu2:8000", b[: first_index(b, Cleared)]),
    ):
        r = Replica(name, None, None)
        r.has_events, r.feed = True, run(items)
        r.blocks = r.feed.blocks
        reps.append(r)
    cached = _Cached(Cluster(reps, tokenizer_folders=[resolve_hf_folder(None)[1]]), 1.0)
    land = [
        {"replica": "gpu1:8000", "salt": "user:bob", "prompt_tokens": 300, "cached_tokens": 256}
    ]
    head, replicas, shared, landings = render(cached, land, False, request())
    assert "“system You are a careful assistant for a public…”" in head + shared
    assert "is held by both replicas" in re.sub("<[^>]+>", "", head) and "gpu1:8000" in landings
    out = html.unescape("".join(render(cached, land, True, request(username="alice"))))
    assert "careful assistant" not in out
    assert "another user's or client's; its words are not shown" in out
    assert "gpu1:8000" not in re.sub(
        r'data-replica="[^"]*"|<h4>[^<]*</h4>', "", out.split("kv-cluster-landings")[1]
    )
