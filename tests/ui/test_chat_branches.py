"""Branch browsing and picking an alternative through the handlers (real SQLite store; the
scripted engine of tests/ui/fake_engine.py stands in for the model here, the browser tests use
the real one)."""

from tests.ui.helpers import KW, collect, prop, req, run, texts
from ui.chat import branches, view
from ui.chat import handlers as chat


def test_edit_then_switch_back_shows_the_old_later_turns_and_continues_there(ctx):  # noqa: F811
    run(collect(chat.send(ctx, "First", dict(KW), req())))
    run(collect(chat.send(ctx, "Second", dict(KW), req())))
    conv = ctx.storage.list_conversations()[0]["id"]
    old_second = ctx.storage.get_messages(conv)[2]
    outs = run(collect(chat.edit(ctx, 2, "Second, edited", dict(KW), req())))
    assert "2/2" in view.shown_text(outs[-1][1][2]["content"])  # the edited message has `< 2/2 >`
    chat_rows, status, _ = branches.switch(ctx, f"{old_second['id']}:123", req())
    assert "1/2" in status and [r for _, r in texts((None, chat_rows))][2] == "Second"
    assert len(chat_rows) == 4  # the old branch's reply is back
    run(collect(chat.send(ctx, "Third", dict(KW), req())))
    path = ctx.storage.get_messages(conv)
    assert [m["content"] for m in path][:3] == ["First", "Hello there!", "Second"]
    assert path[3]["parent_id"] == old_second["id"] and path[4]["content"] == "Third"


def test_switch_is_refused_while_a_reply_is_generated_and_ignores_junk(ctx):  # noqa: F811
    run(collect(chat.send(ctx, "First", dict(KW), req())))
    conv = ctx.storage.list_conversations()[0]["id"]
    first = ctx.storage.get_messages(conv)[0]
    assert ctx.tabs.begin(conv)
    out = branches.switch(ctx, f"{first['id']}:1", req())
    assert all(o.__class__.__name__ != "list" for o in out)  # nothing repainted
    ctx.tabs.end(conv)
    assert branches.parse_command("javascript:alert(1)") is None
    skip = {"__type__": "update"}  # gr.skip(): nothing changes
    assert branches.switch(ctx, "nonsense", req()) == (skip, skip, skip)
    assert branches.switch(ctx, f"{first['id'] + 999}:1", req()) == (
        skip,
        skip,
        skip,
    )  # no such message


def test_pick_the_second_alternative_and_continue_with_its_tokens(ctx):  # noqa: F811
    outs = run(collect(chat.send(ctx, "Hi", dict(KW, n=2), req())))
    conv = ctx.storage.list_conversations()[0]["id"]
    tab = ctx.tab(req())
    assert len(tab.alt_ids) == 2
    first_id, second_id = tab.alt_ids
    assert ctx.storage.get_messages(conv)[-1]["id"] == first_id  # the first stays on screen
    res = branches.pick(ctx, 1, req())
    assert "alternative 2" in res[1]
    assert "shown in the conversation" in res[4] and "shown in the conversation" not in res[3]
    buttons = res[
        3 + view.MAX_ALTERNATIVES :
    ]  # the chosen one loses its button, the other gets one
    assert [prop(b, "visible") for b in buttons] == [True, False, False, False]
    assert ctx.storage.get_messages(conv)[-1]["id"] == second_id
    run(collect(chat.send(ctx, "More", dict(KW), req())))
    path = ctx.storage.get_messages(conv)
    assert path[2]["parent_id"] == second_id
    second = ctx.storage.get_message(second_id)
    assert ctx.llm.previous[-1][-len(second["token_ids"]) :] == second["token_ids"]
    assert prop(outs[-1][-2], "visible") and not prop(
        outs[-1][-1], "visible"
    )  # Send back, Stop gone
