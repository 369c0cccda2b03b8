"""The streaming handlers (ui/chat/handlers.py) against a scripted fake engine and a real SQLite store:
commit order, stored reply and stats, Stop/cancel, bad input, busy conversations, branches."""

import asyncio

import pytest

from ui.chat import handlers as chat
from ui.chat import view
from tests.ui.helpers import KW, collect, prop, req, run, texts


def settle(ctx):
    ctx.tabs._jobs.submit(lambda: None).result(timeout=5)


def test_send_commits_the_user_message_then_streams_and_stores_the_reply(ctx):
    outs = run(collect(chat.send(ctx, "Hi bot", dict(KW), req())))
    st = ctx.storage
    conv = st.list_conversations()[0]
    msgs = st.get_messages(conv["id"])
    assert [(m["role"], m["content"], m["status"]) for m in msgs] == [
        ("user", "Hi bot", "complete"),
        ("assistant", "Hello there!", "complete"),
    ]
    assert msgs[1]["token_ids"] == [100, 101, 102]
    assert msgs[1]["stats"]["cached_tokens"] == 4 and msgs[1]["stats"]["finish_reason"] == "stop"
    messages, params, session = ctx.llm.submitted[0]
    assert (
        session == conv["id"]
        and messages[0]["role"] == "system"
        and messages[-1]["content"] == "Hi bot"
    )
    assert outs[0][0] == ""  # the textbox is cleared
    assert "queued" in view.shown_text(outs[0][1][-1]["content"])  # until the engine admits it
    assert texts(outs[-1]) == [("user", "Hi bot"), ("assistant", "Hello there!")]
    assert "reused 4 of 9 prompt tokens from cache" in view.shown_text(outs[-1][1][-1]["content"])
    assert prop(outs[-1][3], "value") == conv["id"]
    assert not ctx.tabs.is_busy(conv["id"]) and ctx.llm.aborted == []


def test_second_turn_sends_the_whole_branch_in_the_same_session(ctx):
    run(collect(chat.send(ctx, "One", dict(KW), req())))
    run(collect(chat.send(ctx, "Two", dict(KW), req())))
    (m1, _, s1), (m2, _, s2) = ctx.llm.submitted
    assert s1 == s2
    assert [m["content"] for m in m2[1:]] == ["One", "Hello there!", "Two"]


def test_empty_message_is_ignored(ctx):
    outs = run(collect(chat.send(ctx, "  \n ", dict(KW), req())))
    assert len(outs) == 1 and all(o == {"__type__": "update"} for o in outs[0])
    assert ctx.storage.list_conversations() == [] and ctx.llm.submitted == []


def test_too_long_message_is_explained_in_the_chat_and_not_sent_or_stored(ctx):
    outs = run(collect(chat.send(ctx, "word " * 50, dict(KW), req())))
    assert "too long" in view.shown_text(
        outs[-1][1][-1]["content"]
    ) and "40 tokens" in view.shown_text(outs[-1][1][-1]["content"])
    assert ctx.llm.submitted == [] and ctx.storage.list_conversations() == []


def test_engine_value_error_is_shown_and_nothing_is_left_running(ctx):
    def refuse(*a, **k):
        raise ValueError("prompt has 99 tokens; this engine's max_model_len is 40")

    ctx.llm.submit_chat = refuse  # the real engine's answer to a too-long prompt
    outs = run(collect(chat.send(ctx, "Hi", dict(KW), req())))
    assert "max_model_len" in view.shown_text(outs[-1][1][-1]["content"])
    conv = ctx.storage.list_conversations()[0]
    assert not ctx.tabs.is_busy(conv["id"])


def test_stop_button_aborts_in_the_engine_and_shows_the_stored_partial_reply(ctx):
    async def scenario():
        ctx.llm.words = ["Once", " upon", " a", " time"]
        agen = chat.send(ctx, "Story", dict(KW), req())
        outs = []
        async for out in agen:
            outs.append(out)
            if any("upon" in str(o) for o in out):
                ctx.llm.gate.clear()
                break
        stop = asyncio.create_task(chat.stop(ctx, req()))
        await asyncio.sleep(0.05)
        ctx.llm.gate.set()
        async for out in agen:  # the handler ends on its own
            outs.append(out)
        return outs, await stop

    outs, (shown, line, send_btn, stop_btn) = run(scenario())
    assert prop(send_btn, "visible") and not prop(stop_btn, "visible")  # one button: Send again
    assert "stopped" in line and view.shown_text(shown[-1]["content"]).startswith("Once upon")
    conv = ctx.storage.list_conversations()[0]
    assert ctx.storage.get_messages(conv["id"])[-1]["status"] == "stopped"
    assert ctx.llm.ended == []  # the tab still shows it


def test_stop_that_arrives_before_the_turn_starts_still_ends_the_reply(ctx):
    """An API client's /stop can reach the server while the chat is already busy but its reply's
    turn is not registered yet: the turn that appears is aborted too (it used to generate on)."""

    async def scenario():
        run_first = await collect(chat.send(ctx, "Hi", dict(KW), req()))
        conv = ctx.storage.list_conversations()[0]["id"]
        ctx.llm.words = ["Once", " upon", " a", " time"] * 4
        assert ctx.tabs.begin(conv)  # what send does before start_turn
        stop = asyncio.create_task(chat.stop(ctx, req()))
        await asyncio.sleep(0.2)  # stop is waiting on the busy chat
        user = ctx.storage.add_message(conv, "user", "Story", owner=None)
        ctx.llm.gate.clear()  # the stream waits until Stop has aborted it, however slow the machine

        async def open_gate_once_aborted():  # or after 10 s: a Stop that missed the turn fails below
            for _ in range(1000):
                if ctx.llm.aborted:
                    break
                await asyncio.sleep(0.01)
            ctx.llm.gate.set()

        opener = asyncio.create_task(open_gate_once_aborted())
        path = ctx.storage.get_messages(conv)  # the branch through `user`, as send has it
        assert path[-1]["id"] == user["id"]
        outs = await collect(
            chat.generate(ctx, req(), ctx.tab(req()), conv, path, dict(KW, max_tokens=16))
        )
        await opener
        return run_first, outs, await stop, conv

    _, outs, (shown, line, send_btn, stop_btn), conv = run(scenario())
    settle(ctx)
    assert "stopped" in line and prop(send_btn, "visible")
    assert len(set(ctx.llm.aborted)) == 1  # the second reply's request (and only it)
    story = [m for m in ctx.storage.get_messages(conv) if m["role"] == "user"][-1]
    replies = [m for m in ctx.storage.get_messages(conv) if m.get("parent_id") == story["id"]]
    # stopped (or, stopped before its first word, not stored): never the whole 16 words
    assert all(m["status"] == "stopped" for m in replies), [
        (m["status"], m["content"]) for m in replies
    ]


def test_a_conversation_generating_in_another_tab_is_busy(ctx):
    run(collect(chat.send(ctx, "Hi", dict(KW), req("s1"))))
    conv = ctx.storage.list_conversations()[0]["id"]
    ctx.tabs.open(ctx.tab(req("s2")), conv)
    assert ctx.tabs.begin(conv)
    with pytest.warns(UserWarning, match="already being generated"):  # gr.Warning outside a page
        outs = run(collect(chat.send(ctx, "Me too", dict(KW), req("s2"))))
    assert len(outs) == 1 and len(ctx.storage.get_messages(conv)) == 2


def test_regenerate_adds_a_sibling_reply_and_n_alternatives_are_shown(ctx):
    run(collect(chat.send(ctx, "Hi", dict(KW), req())))
    conv = ctx.storage.list_conversations()[0]["id"]
    old = ctx.storage.get_messages(conv)[-1]
    outs = run(collect(chat.regenerate(ctx, dict(KW, n=2), req())))
    path = ctx.storage.get_messages(conv)
    assert len(path) == 2 and path[-1]["id"] != old["id"]
    # both alternatives are stored as versions of the reply; the first one stays on screen
    siblings = [s["id"] for s in ctx.storage.get_siblings(old["id"])]
    assert siblings[:2] == [old["id"], path[-1]["id"]] and len(siblings) == 3
    last = outs[-1]
    assert prop(last[4], "visible") is True
    assert "Alternative 2" in prop(last[6], "value") and prop(last[7], "visible") is False
    picks = last[5 + chat.view.MAX_ALTERNATIVES : 5 + 2 * chat.view.MAX_ALTERNATIVES]
    assert [prop(b, "visible") for b in picks] == [
        False,
        True,
        False,
        False,
    ]  # not the one on screen
    assert ctx.llm.submitted[-1][0][-1]["content"] == "Hi"  # the prompt ends at the user message


def test_edit_branches_at_the_edited_message(ctx):
    run(collect(chat.send(ctx, "First", dict(KW), req())))
    run(collect(chat.send(ctx, "Second", dict(KW), req())))
    conv = ctx.storage.list_conversations()[0]["id"]
    outs = run(
        collect(chat.edit(ctx, 2, [{"type": "text", "text": "Second, edited"}], dict(KW), req()))
    )
    path = ctx.storage.get_messages(conv)
    assert [m["content"] for m in path] == [
        "First",
        "Hello there!",
        "Second, edited",
        "Hello there!",
    ]
    assert len(ctx.storage.get_siblings(path[2]["id"])) == 2
    assert texts(outs[-1])[2] == ("user", "Second, edited")
    # editing a reply is refused; the chat is restored from storage
    outs = run(collect(chat.edit(ctx, 1, "hacked", dict(KW), req())))
    assert texts(outs[-1])[1] == ("assistant", "Hello there!")


def test_owner_checks_refuse_another_users_conversation(ctx):
    ctx.auth = True
    run(collect(chat.send(ctx, "Alice here", dict(KW), req("a", "alice"))))
    conv = ctx.storage.list_conversations()[0]
    assert conv["owner"] == "alice"
    bob = ctx.tab(req("b", "bob"))
    ctx.tabs.open(bob, conv["id"])  # even if bob's tab points at it somehow
    run(collect(chat.send(ctx, "Bob here", dict(KW), req("b", "bob"))))
    assert [m["content"] for m in ctx.storage.get_messages(conv["id"])] == [
        "Alice here",
        "Hello there!",
    ]
    assert {c["owner"] for c in ctx.storage.list_conversations()} == {"alice", "bob"}
