"""The chat and the fair scheduler: each turn is submitted for its user (tenant), and over an
admission bound (engine/core/admission.py, the real AdmissionControl) the chat refuses with a sentence
instead of waiting forever; nothing is left running or busy."""

from engine.core.admission import AdmissionControl, QueueBounds
from tests.ui.helpers import KW, collect, req, run
from ui.chat import handlers as chat
from ui.chat.context import ChatContext
from ui.chat import view


def test_turns_are_submitted_for_the_local_user(ctx):  # noqa: F811
    run(collect(chat.send(ctx, "Hi bot", dict(KW), req())))
    assert ctx.llm.tenants == ["local"]


def test_turns_are_submitted_for_the_logged_in_user(ctx):  # noqa: F811
    auth_ctx = ChatContext(ctx.llm, ctx.storage, ctx.tabs, auth=True)
    run(collect(chat.send(auth_ctx, "Hi bot", dict(KW), req(username="alice"))))
    assert ctx.llm.tenants == ["user:alice"]


def test_a_continued_reply_is_submitted_for_the_logged_in_user(ctx):  # noqa: F811
    auth_ctx = ChatContext(ctx.llm, ctx.storage, ctx.tabs, auth=True)
    run(collect(chat.send(auth_ctx, "Story", dict(KW), req(username="alice"))))
    run(collect(chat.continue_reply(auth_ctx, dict(KW), req(username="alice"))))
    assert ctx.llm.tenants == ["user:alice", "user:alice"]


def test_over_the_bound_the_chat_says_busy_in_a_sentence(ctx):  # noqa: F811
    adm = AdmissionControl(QueueBounds(tenant_max_queued_requests=1))
    adm.enter("someone-else-queued-first", "local", 10)
    real_submit = ctx.llm.submit_chat

    def bounded(messages, params=None, **kw):
        adm.enter(kw.get("request_id") or "r", kw.get("tenant") or "local", 5)  # raises QueueFull
        return real_submit(messages, params, **kw)

    ctx.llm.submit_chat = bounded
    outs = run(collect(chat.send(ctx, "Hi", dict(KW), req())))
    shown = view.shown_text(outs[-1][1][-1]["content"])
    assert "Server busy" in shown and "not queued" in shown and "Try again in about" in shown
    conv = ctx.storage.list_conversations()[0]
    assert not ctx.tabs.is_busy(conv["id"])
    assert adm.queued("local") == (1, 10)  # the refused turn was never counted
