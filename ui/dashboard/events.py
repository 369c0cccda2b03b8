"""The Memory tab's live event feed: what just happened, in words, found by comparing one
snapshot with the one before ("block 0 now shared by 16 chats", "pool full: preempted 'Trip to
Lisbon', recomputing 160 tokens", "pinned prompt 'shared' (34 blocks)", "beam search req-7 forked:
4 beams share 19 prompt blocks", "speculative decoding: 40 drafted tokens accepted, 12 rejected ones
rolled back").

Why by diff: the engine keeps no event log beyond preemptions (and must not grow one per step),
and a diff of two snapshots a second apart is enough for a human watching. Works on scoped
snapshots (engine/observe/viewer_scope.py), so a viewer's feed names only what that viewer may see.
"""

from __future__ import annotations

from collections import deque

from ui.dashboard.vocabulary import NAMES, state_of


def _name(seq: dict) -> str:
    t = seq.get("title")
    return (
        f"'{t}'" if t else str(seq.get("request_id") or seq.get("session_id") or seq.get("seq_id"))
    )


def _groups(snap: dict) -> dict:
    """request id -> running sequences of it (a beam search or n > 1 sampling has several)."""
    out: dict = {}
    for s in snap.get("sequences", []):
        if s.get("state") == "running" and s.get("request_id"):
            out.setdefault(s["request_id"], []).append(s)
    return out


def _most_shared(snap: dict) -> tuple[int, int]:
    refs = snap["blocks"]["ref_count"]
    if not refs:
        return -1, 0
    top = max(refs)
    return (refs.index(top), top) if top >= 2 else (-1, top)


def _speculation(before: dict, after: dict) -> str | None:
    """Speculative decoding since the last tick, summed (a line per step would flood the feed)."""
    acc = after.get("spec_accepted_tokens", 0) - before.get("spec_accepted_tokens", 0)
    back = after.get("spec_rolled_back_slots", 0) - before.get("spec_rolled_back_slots", 0)
    if acc <= 0 and back <= 0:
        return None
    return (
        f"speculative decoding: {acc:,} drafted tokens accepted, {back:,} rejected ones rolled back "
        f"(their slots went back to the pool)"
    )


def diff_events(prev: dict | None, snap: dict) -> list[str]:
    """Lines for what changed from prev to snap (oldest first)."""
    lines: list[str] = []
    before = {p["name"]: p for p in (prev or {}).get("pins", [])}
    after = {p["name"]: p for p in snap.get("pins", [])}
    for name, p in after.items():
        if name not in before or before[name]["block_table"] != p["block_table"]:
            lines.append(f"pinned prompt '{name}' ({len(p['block_table'])} blocks, never evicted)")
    for name in before.keys() - after.keys():
        lines.append(f"unpinned prompt '{name}': its blocks are ordinary cached blocks again")
    if prev is not None:
        seen = {(e.get("time"), e.get("seq_id")) for e in prev.get("preemption_events", [])}
        titles = {
            s.get("request_id"): s for s in snap.get("sequences", []) + prev.get("sequences", [])
        }
        for e in snap.get("preemption_events", []):
            if (e.get("time"), e.get("seq_id")) not in seen:
                who = _name(titles[e["request_id"]]) if e.get("request_id") in titles else "a chat"
                if e.get("mode") == "swap":
                    lines.append(
                        f"pool full: preempted {who}, swapped {e.get('tokens_swapped', 0):,} tokens "
                        f"out to the KV tier, recomputing {e['tokens_lost']:,}"
                    )
                else:
                    lines.append(
                        f"pool full: preempted {who}, recomputing {e['tokens_lost']:,} tokens"
                    )
        seen = {(e.get("time"), e.get("seq_id")) for e in prev.get("tier_events", [])}
        for e in snap.get("tier_events", []):
            if (e.get("time"), e.get("seq_id")) not in seen:
                who = (
                    f"chat {_name(titles[e['request_id']])}"
                    if e.get("request_id") in titles
                    else "a chat"
                )
                where = "from disk" if e.get("kind") == "disk" else "from host memory"
                lines.append(
                    f"{who} resumed {where}: {e['tokens_loaded']:,} tokens loaded, "
                    f"{e.get('tokens_computed', 0):,} computed"
                )
        line = _speculation(prev.get("stats") or {}, snap.get("stats") or {})
        if line:
            lines.append(line)
        old_groups, new_groups = _groups(prev), _groups(snap)
        for rid, seqs in new_groups.items():
            k0 = len(old_groups.get(rid, []))
            k = len(seqs)
            if k > 1 and k > k0:
                shared = sum(1 for x in seqs[0]["shared"] if x)
                lines.append(
                    f"{_name(seqs[0])} forked: {k} beams/samples share {shared} blocks "
                    f"(copy-on-write on divergence)"
                )
            elif 0 < k < k0:
                lines.append(
                    f"{_name(seqs[0])} freed {k0 - k} beam{'s' if k0 - k > 1 else ''} ({k} left)"
                )
        b0, r0 = _most_shared(prev)
        b1, r1 = _most_shared(snap)
        if b1 >= 0 and (b1, r1) != (b0, r0):
            # named by its one state (ui/dashboard/vocabulary.py): a pinned block is "pinned", not "shared"
            state = NAMES[state_of(snap["blocks"]["state"][b1], r1)]
            lines.append(f"{state} block {b1} now held by {r1} holders")
    return lines


class EventFeed:
    """The last `size` lines for one viewer, newest first."""

    def __init__(self, size: int = 12):
        self.lines: deque = deque(maxlen=size)
        self._prev: dict | None = None
        self._time = None
        self.fair_since = 0.0  # the newest scheduler decision already in the feed (who.py)

    def update(self, snap: dict, extra: list[str] = ()) -> list[str]:
        if snap.get("time") != self._time:
            for line in list(extra) + diff_events(self._prev, snap):
                self.lines.appendleft(line)
            self._prev, self._time = snap, snap.get("time")
        return list(self.lines)


def feed_html(lines: list[str]) -> str:
    from html import escape

    if not lines:
        return '<div class="kvd kvf"><div class="muted">Nothing has happened yet.</div></div>'
    items = "".join(f"<li>{escape(x)}</li>" for x in lines)
    return f'<div class="kvd kvf"><h4>What just happened</h4><ul>{items}</ul></div>'
