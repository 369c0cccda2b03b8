"""Issue #12 UI side, without a server: private exports (12), the tab owner check (10), limits
(5, 11) and the deleted-conversation notice (14). Real Storage (SQLite); no engine is needed."""

import os
import re
import stat
from types import SimpleNamespace

import gradio as gr
import pytest

from storage import ConversationDeletedError, Storage
from ui.chat import limits, sidebar, view
from ui.chat.context import ChatContext
from ui.chat.guard import TabOwnerError
from ui.chat.tabs import TabRegistry


class NoEngine:
    """Calls that reach the engine would fail loudly; these handlers must not make any."""


@pytest.fixture
def ctx(tmp_path):
    tabs = TabRegistry(NoEngine())
    c = ChatContext(NoEngine(), Storage(tmp_path / "chat.db"), tabs, auth=True)
    yield c
    tabs.shutdown()
    if c.exports is not None:
        c.exports.close()


def req(user, session="s-alice"):
    return SimpleNamespace(session_hash=session, username=user, query_params={})


def test_exports_are_private_files_not_world_readable(ctx):
    conv = ctx.storage.create_conversation(owner="alice")
    ctx.storage.add_message(conv["id"], "user", "my private question", owner="alice")
    tab = ctx.tab(req("alice"))
    ctx.tabs.open(tab, conv["id"])
    for fmt in ("json", "md"):
        link = sidebar.export(ctx, fmt, req("alice"))
        token = re.search(r'href="exports/([^/]+)/', link).group(1)
        assert ctx.exports.open(token, "bob") is None  # the link is alice's only
        path = str(ctx.exports.open(token, "alice").path)
        assert "my private question" in open(path, encoding="utf-8").read()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert str(ctx.exports.root) in path
    ctx.exports.close()
    assert not os.path.exists(path)


def test_a_tab_answers_only_its_owner(ctx):
    tab = ctx.tab(req("alice"))
    ctx.tabs.open(tab, "conv-a")
    with pytest.raises(TabOwnerError, match="another user"):
        ctx.tab(req("bob"))  # bob with alice's session hash
    with pytest.raises(TabOwnerError):
        sidebar.close_tab(ctx, req("bob"))
    assert ctx.tabs.open_conversations() == {"conv-a": 1}  # alice's session not released
    assert ctx.tab(req("alice")) is tab


@pytest.mark.parametrize(
    "args, field",
    [
        ((float("nan"), 0.9, 0, 16, 1.1, None, 1), "top_p"),
        ((1e-40, 0.9, 0, 16, 1.1, None, 1), "temperature"),
        ((0.7, float("nan"), 0, 16, 1.1, None, 1), "top_p"),
        ((0.7, 0.9, 0, 16, float("nan"), None, 1), "repetition_penalty"),
        ((0.7, 0.9, 0, float("nan"), 1.1, None, 1), ""),
    ],
)
def test_bad_sampling_values_are_clear_errors(args, field):
    with pytest.raises(gr.Error, match="Sampling settings not accepted"):
        limits.sampling(*args)


def test_good_sampling_values_pass():
    assert limits.sampling(0.0, 1.0, 0, 16, 1.0, -1, 1)["temperature"] == 0.0


def test_text_limits_give_plain_errors():
    with pytest.raises(gr.Error, match="lone UTF-16 surrogate"):
        limits.message("a\ud800b")
    with pytest.raises(gr.Error, match="search text is too long"):
        limits.search_query("(" * (limits.MAX_SEARCH_CHARS + 1))
    with pytest.raises(gr.Error, match="message is too long"):
        limits.message("x" * (limits.MAX_MESSAGE_CHARS + 1))
    assert limits.message("ordinary ✓ text") == "ordinary ✓ text"


def test_deleted_notice_has_no_raw_detail():
    raw = str(ConversationDeletedError("message 122 not found"))
    assert "122" in raw  # storage's text carries the raw detail
    assert "122" not in view.deleted_notice() and "deleted" in view.deleted_notice()
