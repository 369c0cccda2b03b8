"""The held-out chats stay held out, and the peers bench judges a peer by its own reference (issue 49).

bench/heldout_chats.py is where KV-format defaults are chosen; a test that read it would let a
future change be tuned on it. The peers bench prints a ratio only for a peer at >= 85% of its own
reference figure in the same run, and "peer handicapped" otherwise; its report must say so.
Pure functions and file reads only (no model, no peer binaries).
"""

import pathlib
import re

from bench import heldout_chats, peers

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_no_test_reads_the_held_out_chats():
    me = pathlib.Path(__file__).resolve()
    use = re.compile(r"import\s+[\w.]*heldout_chats|heldout_chats\s+import|heldout_chats\.(?!py\b)")
    readers = [
        p for p in TESTS.rglob("*.py") if p != me and use.search(p.read_text(errors="ignore"))
    ]
    assert readers == []
    assert use.search("from bench import heldout_chats") and not use.search(
        "bench/heldout_chats.py"
    )


def test_the_held_out_set_is_large_and_mixed():
    msgs = heldout_chats.messages()
    assert len(msgs) >= 24
    text = " ".join(m["content"] for chat in msgs for m in chat)
    assert sum("```" in m["content"] for chat in msgs for m in chat) >= 3
    assert sum(chat[0]["content"] == heldout_chats.LONG_SYSTEM for chat in msgs) >= 3
    assert any(ord(c) > 0x3000 for c in text) and any(0x0400 <= ord(c) < 0x0500 for c in text)


def test_a_peer_below_85_percent_of_its_reference_gets_no_ratio():
    assert peers.verdict(60.0, 50.0, 55.0) == "1.20x"
    assert peers.verdict(60.0, 40.0, 55.0).startswith("peer handicapped")  # 40 < 0.85 x 55
    assert peers.verdict(60.0, 50.0, None).startswith("peer handicapped")  # no reference: no ratio
    assert peers.verdict(None, 50.0, 55.0) == "not measured"
    assert peers.verdict(60.0, 50.0, 55.0, 18.7) == "1.20x"  # 2 threads beat 1: fine
    assert "machine busy" in peers.verdict(60.0, 1.4, 1.5, 18.7)  # 2 threads below 1: busy
