"""What every open chat is, in one line of the Memory tab (issue 26.1 / 26.6).

Why: the README says every open chat is a live engine session, yet a reloaded tab's chat used to
be counted by the tabs and not by the engine (4 tabs, "3 chats"). The two owners are asked
separately and the line says what each chat is, so the counts add up to the open chats:

  generating  a reply is being generated (whether or not a tab shows it: replies belong to the server)
  live        a tab shows it and its engine session holds its blocks between turns
  parked      its last tab closed moments ago; its blocks are kept a few seconds for a reload
  released    a tab shows it but it holds no blocks now (opened from the list after its session
              ended): its next message is prefilled again, mostly from the prefix cache

The chat states come from the tab registry (ui/chat/tabs.TabRegistry.chat_states), the blocks
from the snapshot's sequences, both passed in: this module reads nothing itself.
"""

from __future__ import annotations

from html import escape

ORDER = ("generating", "live", "parked", "released")


def count(chat_states: dict[str, str], snap: dict) -> dict[str, int]:
    """{state: chats} of the chats the tabs know of."""
    holding = {
        str(s.get("session_id"))
        for s in snap.get("sequences") or []
        if s.get("session_id") is not None
    }
    out = dict.fromkeys(ORDER, 0)
    for conv, st in chat_states.items():
        if st == "generating":
            out["generating"] += 1
        elif st == "parked":
            out["parked"] += 1
        else:
            out["live" if str(conv) in holding else "released"] += 1
    return out


def line_html(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return ""
    parts = ", ".join(
        f'<span data-k="open_{k}" data-v="{counts[k]}">{counts[k]:,} {k}</span>'
        for k in ORDER
        if counts[k]
    )
    return (
        f'<div class="muted kvs-open" data-k="open_chats" data-v="{total}">Open chats in this app: '
        f'{total:,} ({escape("")}{parts}).</div>'
    )
