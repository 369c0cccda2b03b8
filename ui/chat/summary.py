"""Start a new chat from a summary of this one (issue 26.3: the context meter's action).

Why: when a chat nears the model's context, the useful part of it must move on. The model writes
a short summary of the conversation (greedy, bounded), and a new chat starts whose system prompt is
the shared one followed by that summary; the old chat stays untouched. The new chat's system
message begins with the shared prompt's text, so its first blocks still hit the prefix cache.
If the conversation itself no longer fits beside the request, its oldest messages are left out
of what the model reads (the summary says what it covers from the newest back).
"""

from __future__ import annotations

import asyncio

from engine import SamplingParams
from ui.chat import view
from ui.chat.tabs import in_daemon_thread

ASK = (
    "Summarize the conversation so far in one short paragraph: the facts, decisions and open "
    "questions a new chat needs to continue it. Write only the summary."
)
SUMMARY_TOKENS = 200
LEAD = "This chat continues an earlier one. A summary of it:\n"


def summary_messages(ctx, system: str, path: list[dict]) -> list[dict]:
    """The engine messages asking for the summary, leaving out the oldest messages until the
    request plus SUMMARY_TOKENS fits the context."""
    path = [m for m in path if m["role"] in ("user", "assistant") and m["content"]]
    while True:
        msgs = view.engine_messages(system, path) + [{"role": "user", "content": ASK}]
        if not path or ctx.prompt_tokens(msgs) + SUMMARY_TOKENS < ctx.max_model_len:
            return msgs
        path = path[1:]


async def summarize(ctx, system: str, path: list[dict]) -> str:
    msgs = await asyncio.to_thread(summary_messages, ctx, system, path)
    params = SamplingParams(max_tokens=SUMMARY_TOKENS, temperature=0.0)
    stream = await asyncio.wrap_future(in_daemon_thread(ctx.llm.submit_chat, msgs, params))
    text = ""
    async for d in stream:
        if d.index == 0:
            text += d.text
    return text.strip()


async def new_chat_from_summary(ctx, request) -> dict | None:
    """Create (and open in this tab) a chat that starts from a summary of the open one; returns
    the new conversation row, or None when there is nothing to summarize."""
    st, tab = ctx.storage, ctx.tab(request)
    if tab.conv_id is None:
        return None
    old = st.get_conversation(tab.conv_id, owner=ctx.check(request))
    path = st.get_messages(old["id"], owner=ctx.check(request))
    if not path:
        return None
    system = st.conversation_system_prompt(old["id"])
    text = await summarize(ctx, system, path)
    if not text:
        raise ValueError("the model wrote an empty summary")
    shared = ctx.shared_prompt(request)["text"]
    title = ("Summary: " + old["title"])[:80]
    conv = st.create_conversation(
        owner=ctx.owner(request),
        title=title,
        system_prompt_override=f"{shared}\n\n{LEAD}{text}".strip(),
    )
    ctx.tabs.open(tab, conv["id"])
    return conv
