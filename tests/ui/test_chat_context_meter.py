"""The context meter (ui/chat/context_meter.py) and its action, a new chat from a summary
(ui/chat/summary.py), issue 26.3. The meter reads a real KVCacheManager's snapshot as /api/kv
serves it; the summary runs against the scripted fake engine with a real SQLite store."""

import asyncio
import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.kv.kv_cache_manager import KVCacheManager
from routes.kv import register_kv_route
from tests.ui.fake_engine import FakeLLM, request
from tests.ui.helpers import chat_context
from ui.chat import context_meter as CM
from ui.chat import summary
from engine.observe.kv_snapshot import take_snapshot

BS = 16


class ManagerLLM:
    """The snapshot face of the engine over a bare manager (what /api/kv and the meter read)."""

    def __init__(self, m):
        self.m = m

    def latest_snapshot(self, compact=False):
        return take_snapshot(self.m).to_json(compact=compact)

    def snapshot(self):
        return self.latest_snapshot()


def pool():
    m = KVCacheManager(64, BS, max_model_len=128)
    system = list(range(64))  # 4 blocks shared by a and b
    m.add_sequence("a#0", system + list(range(500, 520)), num_new_tokens=10**9, session_id="a")
    m.add_sequence("b#0", system + list(range(600, 645)), num_new_tokens=10**9, session_id="b")
    m.park("a#0", "a")  # a: between turns, b: generating
    return m


def test_the_meter_equals_api_kv_for_that_chat():
    m = pool()
    app = FastAPI()
    register_kv_route(app, ManagerLLM(m))
    served = TestClient(app).get("/api/kv", params={"fresh": True}).json()
    a = CM.from_snapshot(served, "a", 128)
    # worked out by hand: 84 tokens in 6 blocks, the first 4 (64 tokens) shared with b
    assert (a.tokens, a.blocks, a.shared_blocks, a.shared_tokens, a.own_tokens) == (
        84,
        6,
        4,
        64,
        20,
    )
    b = CM.from_snapshot(served, "b", 128)
    assert (b.tokens, b.blocks, b.shared_blocks, b.shared_tokens, b.own_tokens) == (
        109,
        7,
        4,
        64,
        45,
    )
    seq = next(s for s in served["sequences"] if s["session_id"] == "b")
    assert b.tokens == seq["num_tokens"] and b.blocks == len(seq["block_table"])
    assert not a.warn and b.warn  # 109 / 128 = 85% >= 80%
    shown = dict(re.findall(r'data-k="([^"]+)" data-v="([^"]*)"', CM.html(b)))
    assert shown == {
        "ctx_tokens": "109",
        "ctx_max": "128",
        "ctx_shared_tokens": "64",
        "ctx_shared_blocks": "4",
        "ctx_pinned_blocks": "0",
        "ctx_own_tokens": "45",
        "ctx_own_blocks": "3",
        "ctx_warn": "1",
    }
    assert CM.from_snapshot(served, "nobody", 128) is None


def test_a_pinned_prompt_counts_as_pinned_in_the_one_vocabulary():
    m = KVCacheManager(64, BS, max_model_len=256)
    system = list(range(32))
    m.add_sequence("a#0", system + [900, 901], num_new_tokens=10**9, session_id="a")
    m.pins.pin("shared", system)  # ref_count 2 (pin + a) but state pinned
    snap = take_snapshot(m).to_json()
    got = CM.from_snapshot(snap, "a", 256)
    assert (got.pinned_blocks, got.pinned_tokens, got.shared_blocks, got.own_tokens) == (
        2,
        32,
        0,
        2,
    )
    assert (
        snap["stats"]["shared_blocks"] == 0 and snap["stats"]["pinned_blocks"] == 2
    )  # as /api/kv says
    shown = dict(re.findall(r'data-k="([^"]+)" data-v="([^"]*)"', CM.html(got)))
    assert (shown["ctx_pinned_blocks"], shown["ctx_shared_blocks"], shown["ctx_own_blocks"]) == (
        "2",
        "0",
        "1",
    )


@pytest.fixture
def ctx(tmp_path):
    with chat_context(FakeLLM(words=["A", " short", " summary."]), tmp_path) as c:
        yield c


def test_a_released_chat_is_measured_from_its_stored_ids(ctx):
    conv = ctx.storage.create_conversation()
    user = ctx.storage.add_message(conv["id"], "user", "Hi", token_ids=list(range(9)))
    ctx.storage.add_message(
        conv["id"], "assistant", "Hello", parent_id=user["id"], token_ids=[1, 2, 3]
    )
    ctx.llm.snap = {"blocks": {"state": [], "ref_count": [], "filled": []}, "sequences": []}
    ctx.tabs.open(ctx.tab(request("s1")), conv["id"])
    m = CM.for_tab(ctx, request("s1"))
    assert (m.tokens, m.in_memory, m.max_model_len) == (12, False, 40)
    assert "not in memory now" in CM.html(m)


def test_the_meter_follows_the_version_on_screen_not_the_one_the_session_holds(ctx):
    """Issue 47: after `< 1/2 >` (or a beam / alternative picked) the engine's session still holds
    the branch its last turn ran; the meter then measures the branch on screen, from storage, and
    says the engine holds another version. A remote backend gives no ids: the reply's usage."""
    conv = ctx.storage.create_conversation()
    user = ctx.storage.add_message(conv["id"], "user", "Hi", token_ids=list(range(9)))
    first = ctx.storage.add_message(
        conv["id"], "assistant", "Hello", parent_id=user["id"], token_ids=[1, 2, 3]
    )
    second = ctx.storage.add_sibling(first["id"], "Hello there, friend", token_ids=list(range(8)))
    m = KVCacheManager(16, BS, max_model_len=40)
    m.add_sequence(
        "c#0", list(range(17)), num_new_tokens=10**9, session_id=conv["id"]
    )  # 9 + 8: the second
    ctx.llm.snap = take_snapshot(m).to_json()
    tab = ctx.tab(request("s1"))
    ctx.tabs.open(tab, conv["id"])
    ctx.tabs.held_by_session(conv["id"], second["id"])
    tab.shown_ids = [user["id"], second["id"]]
    got = CM.for_tab(ctx, request("s1"))
    assert (got.tokens, got.in_memory) == (17, True)  # the engine's, for the version shown
    ctx.storage.select_branch(first["id"])
    tab.shown_ids = [user["id"], first["id"]]  # `‹` to version 1
    got = CM.for_tab(ctx, request("s1"))
    assert (got.tokens, got.in_memory, got.why_not) == (12, False, CM.OTHER_VERSION)
    assert 'data-k="ctx_other_version"' in CM.html(got)
    ctx.storage.update_message(user["id"], token_ids=[])  # a backend's turn: no ids, its usage
    ctx.storage.add_reply_stats(first["id"], prompt_tokens=558, output_tokens=40)
    got = CM.for_tab(ctx, request("s1"))
    assert got.tokens == 558 + 3 and "from the backend's usage" in CM.html(got)


def test_new_chat_from_a_summary_keeps_the_old_chat(ctx):
    import dataclasses

    ctx.llm.info = dataclasses.replace(ctx.llm.info, max_model_len=400)  # room for the whole chat
    conv = ctx.storage.create_conversation(title="Trip planning")
    user = ctx.storage.add_message(conv["id"], "user", "Plan Lisbon")
    ctx.storage.add_message(conv["id"], "assistant", "Day 1: Alfama", parent_id=user["id"])
    tab = ctx.tab(request("s1"))
    ctx.tabs.open(tab, conv["id"])
    new = asyncio.run(summary.new_chat_from_summary(ctx, request("s1")))
    assert new["id"] != conv["id"] and tab.conv_id == new["id"]
    assert new["title"] == "Summary: Trip planning"
    prompt = ctx.storage.conversation_system_prompt(new["id"])
    assert prompt.startswith("You are a helpful assistant.") and prompt.endswith("A short summary.")
    asked = ctx.llm.submitted[-1][0]
    assert asked[-1]["content"] == summary.ASK and [m["content"] for m in asked[1:3]] == [
        "Plan Lisbon",
        "Day 1: Alfama",
    ]
    assert [m["content"] for m in ctx.storage.get_messages(conv["id"])] == [
        "Plan Lisbon",
        "Day 1: Alfama",
    ]
    assert ctx.storage.get_messages(new["id"]) == []


def test_the_summary_request_leaves_out_the_oldest_messages_to_fit(ctx):
    import dataclasses

    ctx.llm.info = dataclasses.replace(ctx.llm.info, max_model_len=80)
    path = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 6}
        for i in range(8)
    ]
    summary.SUMMARY_TOKENS, old = 5, summary.SUMMARY_TOKENS
    try:
        msgs = summary.summary_messages(ctx, "sys", path)  # the fake counts words: 80 here
    finally:
        summary.SUMMARY_TOKENS = old
    assert ctx.prompt_tokens(msgs) + 5 < ctx.max_model_len
    assert msgs[-2]["content"].startswith("message 7") and 3 < len(msgs) < len(path) + 2
