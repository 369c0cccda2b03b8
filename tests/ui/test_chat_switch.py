"""A reply belongs to its conversation, not to the tab's click (issue 10's defect), against the
scripted engine of test_chat_flow and a real SQLite store: switching chats mid-reply stops the
painting at once while the reply finishes into its own chat; the next message goes to the chat on
screen; another tab opening the chat follows the live reply; turns record exact token ids."""

import asyncio

from tests.ui.helpers import KW, req, run, texts
from ui.chat import handlers as chat
from ui.chat import sidebar as side
from ui.chat import view as V


def _conv_with(st, first: str) -> str:
    for c in st.list_conversations():
        msgs = st.get_messages(c["id"])
        if msgs and msgs[0]["content"] == first:
            return c["id"]
    raise KeyError(first)


def test_switching_chats_mid_reply_stops_painting_and_the_reply_lands_in_its_own_chat(ctx):  # noqa: F811
    st = ctx.storage

    async def scenario():
        async for _ in chat.send(ctx, "Chat A", dict(KW), req()):
            pass
        conv_a = _conv_with(st, "Chat A")
        side.new_chat(ctx, req())
        ctx.llm.words = ["Once", " upon", " a", " time", " there"]
        agen = chat.send(ctx, "Chat B", dict(KW), req())
        seen = []
        async for out in agen:
            seen.append(out)
            if any("upon" in str(o) for o in out):
                break
        conv_b = _conv_with(st, "Chat B")
        view = side.open_conversation(ctx, conv_a, req())  # the click on chat A
        assert [V.shown_text(m["content"]).split("\n\n<span")[0] for m in view[0]] == [
            "Chat A",
            "Hello there!",
        ]
        after = [out async for out in agen]  # B's handler lets go at once...
        assert len(after) == 1  # ...and its last paint is chat A, so a late B paint cannot stick
        assert texts(after[0]) == [("user", "Chat A"), ("assistant", "Hello there!")]
        assert after[0][3].value == conv_a
        assert ctx.tabs.is_busy(conv_b)  # ... but B keeps generating
        await ctx.tabs.turn(conv_b).task
        ctx.llm.words = ["Bye"]
        outs = [out async for out in chat.send(ctx, "Next", dict(KW), req())]
        return conv_a, conv_b, outs

    conv_a, conv_b, outs = run(scenario())
    b = st.get_messages(conv_b)
    assert [(m["content"], m["status"]) for m in b] == [
        ("Chat B", "complete"),
        ("Once upon a time there", "complete"),
    ]
    assert [m["content"] for m in st.get_messages(conv_a)] == [
        "Chat A",
        "Hello there!",
        "Next",
        "Bye",
    ]
    assert texts(outs[-1])[-2:] == [("user", "Next"), ("assistant", "Bye")]
    assert ctx.llm.aborted == []


def test_another_tab_opening_a_generating_chat_follows_the_live_reply(ctx):  # noqa: F811
    async def scenario():
        ctx.llm.words = ["One", " two", " three", " four"]
        agen = chat.send(ctx, "Count", dict(KW), req("s1"))
        first = [await agen.__anext__(), await agen.__anext__()]
        conv = _conv_with(ctx.storage, "Count")
        side.open_conversation(ctx, conv, req("s2"))
        other = [out async for out in chat.follow(ctx, req("s2"))]
        mine = first + [out async for out in agen]
        return other, mine

    other, mine = run(scenario())
    assert (
        texts(other[-1])
        == texts(mine[-1])
        == [("user", "Count"), ("assistant", "One two three four")]
    )
    assert len(other) >= 2  # it painted while streaming


def test_each_turn_stores_its_prompt_ids_and_the_next_turn_continues_from_them(ctx):  # noqa: F811
    run(_drain(chat.send(ctx, "One", dict(KW), req())))
    run(_drain(chat.send(ctx, "Two", dict(KW), req())))
    conv = _conv_with(ctx.storage, "One")
    user1, reply1, user2, _ = ctx.storage.get_messages(conv)
    assert user1["token_ids"] == ctx.llm.prompt_ids_of(0) and reply1["token_ids"] == [100, 101, 102]
    assert ctx.llm.previous == [None, user1["token_ids"] + [100, 101, 102]]
    assert user2["token_ids"] == ctx.llm.prompt_ids_of(1)


async def _drain(agen):
    async for _ in agen:
        pass
    await asyncio.sleep(0)


def test_the_tick_sends_the_list_and_the_chat_only_when_they_changed(ctx):  # noqa: F811
    run(_drain(chat.send(ctx, "Mine", dict(KW), req("s1"))))
    conv = _conv_with(ctx.storage, "Mine")
    side.open_conversation(ctx, conv, req("s2"))  # another tab shows the same chat
    radio, shown = chat.refresh(ctx, "", req("s2"))
    assert radio == {"__type__": "update"} and shown == {"__type__": "update"}  # nothing new
    run(_drain(chat.send(ctx, "More", dict(KW), req("s1"))))  # tab 1 continues it
    side.new_chat(ctx, req("s1"))
    ctx.storage.create_conversation()  # and starts another chat
    radio, shown = chat.refresh(ctx, "", req("s2"))
    assert len(radio.choices) == 2 and radio.value == conv  # tab 2's list, its chat still selected
    assert [V.shown_text(m["content"]).split("\n\n<span")[0] for m in shown][-2:] == [
        "More",
        "Hello there!",
    ]
    assert chat.refresh(ctx, "", req("s2")) == ({"__type__": "update"}, {"__type__": "update"})
