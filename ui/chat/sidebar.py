"""Conversation list, system prompts, export/import and tab lifecycle: short synchronous handlers.

Access rule: with --auth every storage call passes the user as owner, so another user's
conversation id raises PermissionError, which becomes a refusal notice here.
"""

from __future__ import annotations

import atexit
import html
import json
import os

import gradio as gr

from storage.exports import export_url
from ui.chat import limits, thinking, view
from ui.chat.painting import conversation_list, list_radio, show
from ui.chat.context import ChatContext


def _refuse(what: str = "That conversation") -> None:
    gr.Warning(f"{what} does not exist or belongs to another user.")


def _prompt_line(ctx: ChatContext, conv: dict | None, request=None) -> str:
    current = ctx.shared_prompt(request)["id"]
    if conv is None:
        return f"New chats use the shared system prompt (#{current})."
    return view.prompt_summary(conv["system_prompt_override"], conv["system_prompt_id"], current)


def _conversation_view(ctx: ChatContext, request, tab, conv: dict | None):
    """(chatbot, status, list, title box, override box, prompt line, alt row, Think switch) for a
    tab's chat."""
    shown = show(tab, ctx.storage.get_messages(conv["id"]) if conv is not None else [], ctx)
    return (
        shown,
        " ",
        conversation_list(ctx, request, conv["id"] if conv else None),
        conv["title"] if conv else "",
        (conv or {}).get("system_prompt_override") or "",
        _prompt_line(ctx, conv, request),
        gr.Row(visible=False),
        gr.Checkbox(value=thinking.switch_value(conv), visible=ctx.thinking_switch),
    )


def on_load(ctx: ChatContext, request):
    """A tab opened (or reloaded): register it and show the chat its address names (`/?c=<id>`),
    the list and the shared prompt. An unknown or foreign id opens a new chat."""
    tab = ctx.tab(request)
    wanted = (getattr(request, "query_params", None) or {}).get("c")
    if wanted and wanted != tab.conv_id:
        try:
            ctx.storage.get_conversation(wanted, owner=ctx.check(request))
            ctx.tabs.open(tab, wanted)
        except (KeyError, PermissionError):
            _refuse()
    conv = None
    if tab.conv_id is not None:
        try:
            conv = ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            ctx.tabs.open(tab, None)
    return _conversation_view(ctx, request, tab, conv) + (ctx.shared_prompt(request)["text"],)


def signed_in(ctx: ChatContext, request) -> str:
    """Under --auth: who is signed in, and the way out (Gradio's /logout ends the login)."""
    user = getattr(request, "username", None) if ctx.auth else None
    if not user:
        return ""
    return (
        f'<div class="signed-in">Signed in as <b>{html.escape(str(user))}</b> · '
        f'<a href="logout" id="log-out">Log out</a></div>'
    )


def new_chat(ctx: ChatContext, request):
    tab = ctx.tab(request)
    ctx.tabs.open(tab, None)
    return _conversation_view(ctx, request, tab, None)


def open_conversation(ctx: ChatContext, conv_id, request):
    tab = ctx.tab(request)
    if not conv_id:
        return new_chat(ctx, request)
    try:
        conv = ctx.storage.get_conversation(conv_id, owner=ctx.check(request))
    except (KeyError, PermissionError):
        _refuse()
        current = None
        if tab.conv_id:
            try:
                current = ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))
            except (KeyError, PermissionError):
                ctx.tabs.open(tab, None)
        return _conversation_view(ctx, request, tab, current)
    ctx.tabs.open(tab, conv_id)
    return _conversation_view(ctx, request, tab, conv)


def search(ctx: ChatContext, query: str, request):
    tab = ctx.tab(request)
    query = limits.search_query(query)
    rows = ctx.storage.list_conversations(owner=ctx.check(request), query=query or None)
    choices = view.conversation_choices(rows)
    value = tab.conv_id if any(c[1] == tab.conv_id for c in choices) else None
    tab.list_sig = (tuple(choices), value, (query or "").strip() or None)
    return list_radio(choices, value, (query or "").strip() or None)


def _tab_conversation(ctx: ChatContext, request):
    tab = ctx.tab(request)
    if tab.conv_id is None:
        return tab, None
    try:
        return tab, ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))
    except (KeyError, PermissionError):
        ctx.tabs.open(tab, None)
        return tab, None


def rename(ctx: ChatContext, title: str, request):
    title = limits.title(title)
    tab, conv = _tab_conversation(ctx, request)
    if conv is None:
        gr.Info("Open a conversation first.")
    elif not (title or "").strip():
        gr.Info("A title cannot be empty.")
    else:
        ctx.storage.rename_conversation(conv["id"], title, owner=ctx.check(request))
    return conversation_list(ctx, request, tab.conv_id)


def delete(ctx: ChatContext, request):
    tab, conv = _tab_conversation(ctx, request)
    if conv is None:
        gr.Info("No conversation is open.")
    elif ctx.tabs.is_busy(conv["id"]):
        gr.Warning("Stop the reply being generated before deleting this conversation.")
        return _conversation_view(ctx, request, tab, conv)
    else:
        ctx.storage.delete_conversation(conv["id"], owner=ctx.check(request))
        ctx.tabs.forget(conv["id"])  # every tab showing it lets go; blocks released
        gr.Info(f"Deleted “{conv['title']}”.")
    return _conversation_view(ctx, request, tab, None)


def export(ctx: ChatContext, fmt: str, request):
    _, conv = _tab_conversation(ctx, request)
    if conv is None:
        gr.Info("Open a conversation to export it.")
        return None
    if fmt == "json":
        data = ctx.storage.export_json(conv["id"], owner=ctx.check(request))
        text, name = (
            json.dumps(data, ensure_ascii=False, indent=2),
            view.export_filename(conv["title"], "json"),
        )
    else:
        text = ctx.storage.export_markdown(conv["id"], owner=ctx.check(request))
        name = view.export_filename(conv["title"], "md")
    export = _exports(ctx).write(name, text, owner=ctx.owner(request) or None)
    return view.export_link(export_url(export.token, export.name), export.name, export.size)


def _exports(ctx: ChatContext):
    """The app's private export folder (#12.12): 0600 files in 0700 folders, swept after 15 min,
    removed at exit, each downloadable by its owner only (routes/exports.py). build_app creates it
    with the route; created here on first use when the demo runs without that app."""
    if ctx.exports is None:
        from storage.exports import PrivateExports

        ctx.exports = PrivateExports()
        atexit.register(ctx.exports.close)
    return ctx.exports


def import_json(ctx: ChatContext, file, request):
    """Import an exported JSON file as a new conversation of this user, and open it."""
    tab = ctx.tab(request)
    path = getattr(file, "name", None) or (file.get("path") if isinstance(file, dict) else file)
    try:
        limits.import_size(path)  # refused before reading it
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        limits.import_data(data)  # refused before storing any of it
        conv = ctx.storage.import_json(data, owner=ctx.owner(request))
    except gr.Error:  # a limit: its own clear message, as an error
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        gr.Warning(f"Could not import that file: {e}")
        return _conversation_view(ctx, request, *_tab_conversation(ctx, request))
    finally:
        _discard_upload(path)
    conv_id = conv["id"] if isinstance(conv, dict) else conv
    # a title of its own, so the copy and the original are told apart in the list (issue 26.7)
    row = ctx.storage.get_conversation(conv_id)
    ctx.storage.rename_conversation(conv_id, view.imported_title(row["title"]))
    ctx.tabs.open(tab, conv_id)
    gr.Info("Conversation imported.")
    return _conversation_view(ctx, request, tab, ctx.storage.get_conversation(conv_id))


def _discard_upload(path) -> None:
    """Remove an uploaded import from Gradio's upload cache once read: Gradio would otherwise keep
    serving it at /gradio_api/file=... to any logged-in user with the URL (#12.12). Only files
    inside that cache are touched."""
    try:
        from gradio.utils import get_upload_folder

        cache = os.path.realpath(get_upload_folder())
        real = os.path.realpath(str(path))
        if os.path.commonpath([cache, real]) == cache and os.path.isfile(real):
            os.remove(real)
    except (OSError, TypeError, ValueError, ImportError):
        pass


def save_shared_prompt(ctx: ChatContext, text: str, request):
    """A new shared prompt: conversations created from now on use it (and share its blocks). Under
    --auth it is this user's own; others' new chats are unchanged. Pinned (ui/chat/prompt_pins.py)."""
    text = limits.prompt(text)
    if not (text or "").strip():
        gr.Info("The shared system prompt cannot be empty.")
        return ctx.shared_prompt(request)["text"], gr.skip()
    owner = ctx.owner(request) or None
    if ctx.pins is not None:
        try:
            ctx.pins.check(owner, text)
        except ValueError as e:  # too long, or past the pin cap: this user only
            gr.Warning(str(e))
            return ctx.shared_prompt(request)["text"], gr.skip()
    ctx.storage.set_system_prompt(text, owner=owner)
    if ctx.pins is not None:
        ctx.pins.pin_async(owner, text)
    gr.Info("Saved: new chats use this system prompt.")
    return text, _prompt_line(ctx, _tab_conversation(ctx, request)[1], request)


def set_override(ctx: ChatContext, text: str | None, request):
    """Give the open conversation its own system prompt (None: back to its shared prompt).
    With no conversation open, one is created so the override has somewhere to live."""
    if text is not None:
        text = limits.prompt(text)
    tab, conv = _tab_conversation(ctx, request)
    if text is not None and not text.strip():
        text = None
    if conv is None:
        if text is None:
            return gr.skip(), _prompt_line(ctx, None, request), gr.skip()
        conv = ctx.storage.create_conversation(
            owner=ctx.owner(request), system_prompt_override=text
        )
        ctx.tabs.open(tab, conv["id"])
    else:
        conv = ctx.storage.set_conversation_system_prompt(
            conv["id"], text, owner=ctx.check(request)
        )
    gr.Info(
        "This conversation now uses its own system prompt."
        if text is not None
        else "This conversation uses its shared system prompt again."
    )
    return text or "", _prompt_line(ctx, conv, request), conversation_list(ctx, request, conv["id"])


def close_tab(ctx: ChatContext, request) -> str:
    """API clients (no browser tab to close): release this client's conversation now."""
    ctx.tab(request)  # owner check (#12.10)
    ctx.tabs.close(request.session_hash)
    return "closed"
