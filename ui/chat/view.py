"""Plain view logic of the chat page: no Gradio, no engine, no storage — unit-tested directly.

Stored messages (rows from storage) -> what the model sees (`engine_messages`) and what the
chatbot shows (`display_messages`); reply stats -> one short line; widget values -> sampling
arguments; conversation rows -> sidebar choices.
"""

from __future__ import annotations

import base64
import html
import math
import re

from storage.md_fences import close_open_fence
from ui.safe_markdown import safe_markdown
from ui.chat import documents, thinking
from ui.chat.states import finish_text

MAX_ALTERNATIVES = 4
QUEUED = "*queued: waiting for a free slot in the engine…*"
STARTING = "…"
STATS_CLASS = "reply-stats"


def text_of(content) -> str:
    """Chat content as text: Gradio 6 hands handlers a list of blocks ([{"type": "text", ...}])."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("content") or "")
    if isinstance(content, (list, tuple)):
        return "".join(
            text_of(c)
            for c in content
            if not isinstance(c, dict) or c.get("type", "text") == "text"
        )
    return str(content)


def engine_messages(system_prompt: str | None, path: list[dict]) -> list[dict]:
    """The message list sent to the engine: the system prompt (if any) then the active branch.

    Contents are passed exactly as stored, so the rendered prompt starts with the previous
    turn's text and the engine session reuses that turn's token ids.
    """
    out = []
    if system_prompt and system_prompt.strip():
        out.append({"role": "system", "content": system_prompt})
    for m in path:
        if m["role"] in ("user", "assistant", "system"):
            out.append({"role": m["role"], "content": m["content"]})
    return out


def path_until(path: list[dict], message_id: int) -> list[dict]:
    """The branch from the root through `message_id` (drops what came after it)."""
    for i, m in enumerate(path):
        if m["id"] == message_id:
            return path[: i + 1]
    raise KeyError(f"message {message_id} is not on this branch")


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def stats_line(
    stats: dict | None,
    status: str | None = None,
    finish: str | None = None,
    total_tokens: int | None = None,
) -> str:
    """One line under a reply: tokens (and, with speculative decoding, how many came from accepted
    drafts and the tokens per decoding step), time to first token, tokens/s, prompt tokens reused
    from cache, and why it ended (`finish`, from states.finish_text; derived from the stats when not
    given). total_tokens: the whole reply's, when this run only continued it ("+256 (512
    total)")."""
    stats = stats or {}
    parts = []
    if stats.get("output_tokens") is not None:
        n = stats["output_tokens"]
        if total_tokens is not None and total_tokens > n:
            parts.append(f"+{n} token{'s' if n != 1 else ''} ({total_tokens:,} total)")
        else:
            parts.append(f"{n} token{'s' if n != 1 else ''}")
        acc, steps = stats.get("spec_accepted_tokens"), stats.get("decode_steps")
        if acc and steps:  # speculative decoding: tokens that came from checked guesses
            parts.append(f"{acc} accepted from drafts ({(steps + acc) / steps:.1f} tokens/step)")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {_fmt_s(stats['ttft_s'])}")
    tps = stats.get("tokens_per_s")
    if tps is not None and math.isfinite(tps):
        parts.append(f"{tps:.1f} tok/s")
    if stats.get("prompt_tokens") is not None:
        cached = stats.get("cached_tokens") or 0
        blocks = stats.get("cached_blocks")
        held = f" ({blocks} block{'s' if blocks != 1 else ''})" if blocks is not None else ""
        where = f" on {stats['served_by']}" if stats.get("served_by") else ""
        parts.append(
            f"reused {cached} of {stats['prompt_tokens']} prompt tokens from cache{held}{where}"
        )
    elif stats.get("served_by"):
        parts.append(f"served by {stats['served_by']}")
    if finish is None:
        finish = finish_text(stats, status)
    if finish:
        parts.append(finish)
    return " · ".join(parts)


def close_fences(text: str) -> str:
    """Close a code fence left open (a reply cut by max tokens or Stop), so what follows is not
    code: decided as a CommonMark renderer decides (storage/md_fences.py)."""
    return close_open_fence(text)


def row_content(*parts: str):
    """A chat row's content: the message's Markdown, then our own parts (stats line, copy source,
    version arrows), each rendered by the chatbot as a Markdown block of its own (issue 47). Why
    separate: appended to the message's text, a part sat inside whatever the text left open, e.g.
    a code fence the model never closed, and showed as raw HTML in the code block (and Copy then
    read that HTML). One part: the plain string."""
    parts = tuple(p for p in parts if p)
    if len(parts) <= 1:
        return parts[0] if parts else ""
    return [{"type": "text", "text": p} for p in parts]


def shown_text(content) -> str:
    """A row's content as one text, parts separated by a blank line (tests, notices)."""
    if isinstance(content, list):
        return "\n\n".join(text_of(p) for p in content)
    return text_of(content)


def rendered(text: str) -> str:
    """Message text (untrusted: model output, imports) as Markdown the browser may render: no
    remote images, raw HTML, forms, scripts or script links (#12.7). Every shown message and
    alternative goes through here; only our own stats footer and branch arrows are added after it."""
    return safe_markdown(close_fences(text))


def with_footer(
    text: str,
    stats: dict | None,
    status: str | None = None,
    finish: str | None = None,
    source: bool = False,
    nav: str = "",
    total_tokens: int | None = None,
    split=None,
    live: bool = False,
):
    """A reply's row content (row_content): its text (made safe), then its stats line, small and
    muted (display only; never sent to the model), the text's Markdown for copying (source_mark,
    with `source`) and the version arrows (`nav`), in a part of their own. `split` (a thinking
    model's reply: engine/text/reasoning.Split): the reasoning folded in a part of its own above
    the answer (ui/chat/thinking.py); the answer alone is shown, counted and copied."""
    line = stats_line(stats, status, finish, total_tokens)
    stats_html = f'<span class="{STATS_CLASS}">{html.escape(line)}</span>' if line else ""
    if thinking.has_fold(split):
        answer = split.content
        folded = thinking.fold(
            rendered(split.reasoning),
            split.reasoning_tokens,
            live=live and not answer,
            answered=bool(answer.strip()) or live,
        )
        mark = source_mark(answer) if source else ""
        return row_content(folded, rendered(answer) if answer else "", stats_html + mark + nav)
    if split is not None and split.reasoning is not None:  # an empty block: the answer alone
        text = split.content
    mark = source_mark(text) if source else ""
    return row_content(rendered(text), stats_html + mark + nav)


SOURCE_CLASS = "md-src"


def source_mark(text: str) -> str:
    """An empty span carrying a reply's stored Markdown (base64 of its UTF-8) for the page's copy
    button and Ctrl+Shift+C (ui/page_assets.py). Why: the page shows rendered HTML, and text
    rebuilt from it loses what rendering dropped (`**`, list markers, a fence's exact form), so a
    copy would not be the reply. Base64 keeps the attribute free of quotes, `<`, `&` and newlines,
    which Markdown and the HTML sanitizer could otherwise read. The attribute is `title` because
    the chatbot's sanitizer keeps it (it drops data-*); `hidden` keeps the span out of the
    accessibility tree. Written on stored replies only (not on every streamed repaint, where it
    would double the bytes sent per token)."""
    data = base64.b64encode(text.encode("utf-8")).decode("ascii")
    return f'<span class="{SOURCE_CLASS}" hidden title="{data}"></span>'


BRANCH_HREF = "#branch-"


def branch_nav(message_id: int, versions: list[int]) -> str:
    """`< 2/3 >` under a message with several versions: two links the page's script turns into a
    branch switch (ui/events.py); a link at either end is left out rather than doing nothing."""
    pos = versions.index(message_id)
    prev = f"[‹]({BRANCH_HREF}{versions[pos - 1]} \"previous version\")" if pos > 0 else "‹"
    nxt = (
        f"[›]({BRANCH_HREF}{versions[pos + 1]} \"next version\")"
        if pos + 1 < len(versions)
        else "›"
    )
    return f'<span class="branch-nav">{prev} {pos + 1}/{len(versions)} {nxt}</span>'


def display_messages(
    path: list[dict], versions: dict | None = None, max_model_len: int | None = None, eos_ids=()
) -> tuple[list[dict], list[int]]:
    """Chatbot messages for a stored branch, and the stored id of each shown row. `versions`
    (storage.branch_versions) adds `< k/n >` to messages that have other versions."""
    shown, ids = [], []
    for i, m in enumerate(path):
        if m["role"] not in ("user", "assistant"):
            continue
        nav = branch_nav(m["id"], versions[m["id"]]) if versions and m["id"] in versions else ""
        if m["role"] == "assistant":
            toks = m.get("token_ids") or []
            finish = finish_text(
                m.get("stats"), m.get("status"), max_model_len, toks[-1] if toks else None, eos_ids
            )
            more = CONTINUE_MARK if i == len(path) - 1 and can_continue(m, finish, eos_ids) else ""
            content = with_footer(
                m["content"],
                m.get("stats"),
                m.get("status"),
                finish,
                source=True,
                nav=nav + more,
                total_tokens=len(toks) or None,
                split=thinking.stored_split(m["content"], m.get("stats")),
            )
        else:  # one part: Gradio edits a user row part by part and hands back only the last
            content = documents.display(m["content"], rendered) + (f"\n\n{nav}" if nav else "")
        shown.append({"role": m["role"], "content": content})
        ids.append(m["id"])
    return shown, ids


def live_reply(
    text: str,
    admitted: bool,
    metrics: dict | None = None,
    state: str | None = None,
    total_tokens: int | None = None,
    split=None,
):
    """The reply bubble while streaming: queued -> starting -> text with a running stats line
    (`state`: a live status from states.live_status, shown in place of the stats while paused).
    `split`: a thinking model's reply so far (its reasoning folded, open while it streams)."""
    if not admitted:
        return f"*{state}*" if state else QUEUED
    if state and "paused" in state:
        return row_content(rendered(text) if text else "", f"*{state}*")
    if not text:
        return STARTING
    if thinking.has_fold(split) or (split is not None and split.reasoning is not None):
        return with_footer(text, metrics, total_tokens=total_tokens, split=split, live=True)
    return with_footer(text, metrics, total_tokens=total_tokens) if metrics else rendered(text)


# Marks a reply row that is only a notice (nothing was sent or saved): BUTTONS_CSS hides
# Regenerate while one is on screen.
NOTICE_MARK = '<span class="chat-notice"></span>'
# Marks the last reply when Continue can extend it (stopped, or cut by max tokens, with its ids):
# BUTTONS_CSS shows Continue only then (issue 47: it was offered with nothing to continue).
CONTINUE_MARK = '<span class="can-continue"></span>'


def can_continue(m: dict, finish: str | None, eos_ids=()) -> bool:
    toks = m.get("token_ids") or []
    cut = m.get("status") == "stopped" or (m.get("stats") or {}).get("finish_reason") == "length"
    full = (finish or "").startswith("context full")
    return bool(toks) and cut and toks[-1] not in eos_ids and not full


# No button that does nothing (#11), decided in the page from what it shows (no round trip):
# Regenerate (#regen-row) only with a reply on screen, no notice in place of one, and no reply
# generating (#stop is in the page only then); the title, Rename/Delete and Export act on the chat on
# screen, so they are hidden on a new chat: nothing in the chat and no chat selected in the list
# (either alone is not enough: an imported empty chat has no message; a search may hide the open one).
BUTTONS_CSS = """
.gradio-container:not(:has(#chatbot .message.bot)) #regen-row, .gradio-container:has(#chatbot .chat-notice) #regen-row,
.gradio-container:has(#stop) #regen-row { display: none !important; }
.gradio-container:not(:has(#chatbot .can-continue)) #continue-reply { display: none !important; }
.gradio-container:not(:has(#chatbot .message)):not(:has(#conv-list input:checked)) :is(#chat-title, #manage-row,
#export-row) { display: none !important; }
"""


def too_long_notice(prompt_tokens: int, limit: int) -> str:
    return (
        f"**This message is too long for the model.** With it the prompt would be "
        f"{prompt_tokens} tokens, and this server's context holds {limit} tokens (prompt plus "
        f"at least one generated token). Nothing was sent; shorten it or start a new chat.{NOTICE_MARK}"
    )


DELETED_TEXT = (
    "This conversation was deleted (in another window or by another process using the "
    "same history), so this reply could not be saved."
)


def deleted_notice() -> str:
    """Shown instead of storage's ConversationDeletedError text (which carries a raw detail)."""
    return f"**Not saved.** {DELETED_TEXT}{NOTICE_MARK}"


def error_notice(message: str) -> str:
    return f"**The engine could not answer:** {message}"


def sampling_kwargs(temperature, top_p, top_k, max_tokens, repetition_penalty, seed, n) -> dict:
    """Widget values -> SamplingParams keyword arguments (top-k 0 and an empty seed mean off)."""
    top_k = int(top_k or 0)
    seed_value = None
    if seed is not None and str(seed).strip() not in ("", "-1"):
        seed_value = int(float(seed))
    return {
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": top_k if top_k > 0 else -1,
        "max_tokens": int(max_tokens),
        "repetition_penalty": float(repetition_penalty),
        "seed": seed_value,
        "n": max(1, min(MAX_ALTERNATIVES, int(n))),
    }


def conversation_choices(rows: list[dict]) -> list[tuple[str, str]]:
    """Sidebar radio choices (label, id), newest first as given."""
    return [(r["title"] or "Untitled", r["id"]) for r in rows]


def alternative_markdown(
    index: int,
    text: str,
    stats: dict | None,
    admitted: bool = True,
    status: str | None = None,
    label: str = "Alternative",
    chosen: bool = False,
    split=None,
) -> str:
    """One of the n alternatives / k beams beside the chat; `split`: a thinking model's reply
    (its reasoning folded above the answer, as in the chat)."""
    head = f"**{label} {index + 1}**"
    line = stats_line(stats, status)
    if chosen and text and admitted:  # its text is the reply in the chat just above: not twice
        return f"{head} · shown in the conversation above" + (
            f'\n\n<span class="{STATS_CLASS}">{html.escape(line)}</span>' if line else ""
        )
    if not text or not admitted:
        body = shown_text(live_reply(text, admitted))
    elif thinking.has_fold(split):
        body = thinking.fold(
            rendered(split.reasoning), split.reasoning_tokens, answered=bool(split.content.strip())
        ) + (f"\n\n{rendered(split.content)}" if split.content else "")
    else:
        empty_block = split is not None and split.reasoning is not None
        body = rendered(split.content if empty_block else text)
    return f"{head}\n\n{body}" + (
        f'\n\n<span class="{STATS_CLASS}">{html.escape(line)}</span>' if line else ""
    )


def export_filename(title: str, ext: str) -> str:
    """A safe file name from a conversation title."""
    stem = re.sub(r"[^\w\-]+", "-", title or "conversation").strip("-_")[:40] or "conversation"
    return f"{stem}.{ext}"


def export_link(url: str, name: str, size: int) -> str:
    """The download link shown after an export (the file stays with the app, for its owner only)."""
    kib = f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} bytes"
    return (
        f'<a class="export-link" href="{html.escape(url, quote=True)}" download="{html.escape(name, quote=True)}">'
        f"Download {html.escape(name)}</a> ({kib}; the link works for you only, for 15 minutes)"
    )


def prompt_summary(override: str | None, shared_id: int | None, current_shared_id: int) -> str:
    """Which system prompt a conversation uses, for the line under the prompt editors."""
    if override is not None:
        return "This conversation uses its own system prompt (override)."
    if shared_id is not None and shared_id != current_shared_id:
        return (
            f"This conversation uses an older shared prompt (#{shared_id}); new chats use "
            f"#{current_shared_id}."
        )
    return f"This conversation uses the shared system prompt (#{current_shared_id})."


def imported_title(title: str, limit: int = 200) -> str:
    """An imported chat's title: the original's with "(imported)", so the two differ in the list."""
    base = (title or "Imported chat").strip()
    return base if base.endswith("(imported)") else (base[: limit - 11].rstrip() + " (imported)")
