"""Replies belong to the server, not to the page: the rule, and the one timeout that bounds it.

Why: a browser tab is a view. A reload, a closed tab, a phone that sleeps or a dropped network
cancels the tab's Gradio handler, and before this rule that cancel ended the reply ("stopped").
ChatGPT and open-webui users expect the reply to keep generating and the page to pick it up
again. So the reply is a `Turn` (ui/chat/turn.py) running as its own task; a cancelled handler
only stops painting, and any tab of the same user that opens the chat reattaches to the live
turn (handlers.follow) and first paints everything generated meanwhile.

What ends a reply: Stop (handlers.stop aborts it in the engine), its own end (EOS / max tokens /
error), or this module's idle timeout: a reply that no tab has shown for `ABANDON_S` seconds is
aborted and stored as "stopped", so a forgotten tab cannot hold a sequence slot and its blocks
for the rest of a long max_tokens. The watchdog looks every `CHECK_S`; it never touches a reply
some tab shows, however long it runs.
"""

from __future__ import annotations

import asyncio
import time

ABANDON_S = 600.0  # a reply nobody watches is aborted after 10 minutes
CHECK_S = 2.0


async def watch_abandoned(
    ctx, turn, abandon_s: float | None = None, check_s: float | None = None, clock=time.monotonic
) -> bool:
    """Run beside `turn` until it ends; abort it once no tab has shown its conversation for
    `abandon_s`. Returns True if it aborted the turn."""
    from ui.chat.turn import abort_turn

    abandon_s = ABANDON_S if abandon_s is None else abandon_s
    check_s = CHECK_S if check_s is None else check_s
    unwatched_since = None
    while not turn.finished:
        if ctx.tabs.is_watched(turn.conv_id):
            unwatched_since = None
        elif unwatched_since is None:
            unwatched_since = clock()
        elif clock() - unwatched_since >= abandon_s:
            turn.abandoned = True
            abort_turn(ctx, turn)
            return True
        await asyncio.sleep(check_s)
    return False
