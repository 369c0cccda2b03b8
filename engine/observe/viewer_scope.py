"""What one viewer may see of a KV snapshot: titles instead of ids, and under --auth only their
own chats (issue 11 item 5, issue 12 item 9).

Why in engine/observe (the lowest floor that fits): it is a pure function of the snapshot's JSON
(paged-chat.kv) and a titles dict, with no import of storage or of any page; the dashboard (ui/) and
/api/kv (routes/) both pass a snapshot through `scope_snapshot` before anything reaches a browser,
and routes must not import ui. The engine itself never calls it: it knows sessions, not people or
titles; `titles_for` asks the storage object it is handed (duck-typed, never imported).

Rules:
- without --auth (`viewer` None): every sequence stays, each titled from storage;
- with --auth: the viewer's own chats keep ids and titles; every other sequence (other users'
  chats, demo users, API calls) is removed and counted as {"chats", "blocks"} under "others";
  block-level arrays (state, ref_count, filled) stay, as they identify nobody; `owners` is rebuilt
  from the kept tables; preemption events of others lose their ids; other users' pinned prompts
  are named "another user's prompt"; state slots held by others say "another chat";
- aggregate stats are never changed, so the headline equals /metrics and the unscoped numbers.
"""

from __future__ import annotations

PIN_APP = "shared"  # the app's own shared prompt
PIN_USER_PREFIX = "user:"  # a user's own prompt under --auth: "user:<name>"


def pin_name_for(owner: str | None) -> str:
    return f"{PIN_USER_PREFIX}{owner}" if owner else PIN_APP


def _title_of(sid, titles: dict, own_conv: str | None) -> str | None:
    if sid is None:
        return None
    sid = str(sid)
    if sid.startswith("demo-"):
        return f"demo user {sid.rsplit('-', 1)[-1]}"
    t = titles.get(sid)
    if t is None:
        return None
    return f"{t} (this tab)" if sid == own_conv else t


def scope_snapshot(
    snap: dict, *, titles: dict, viewer: str | None, own_conv: str | None = None, auth: bool = False
) -> dict:
    """A copy of snap for one viewer. titles: conversation id -> title of the conversations the
    viewer may see (all of them without --auth; their own with it)."""
    out = dict(snap)
    kept, others, other_blocks = [], set(), set()
    for s in snap.get("sequences", []):
        sid = s.get("session_id")
        mine = sid is not None and str(sid) in titles
        if auth and not mine:
            others.add(sid if sid is not None else s.get("request_id") or s.get("seq_id"))
            other_blocks.update(s["block_table"])
            continue
        s = dict(s)
        s["title"] = _title_of(sid, titles, own_conv) or s.get("title")
        kept.append(s)
    out["sequences"] = kept
    owners: dict[str, list] = {}
    for s in kept:
        who = s["seq_id"] if s.get("seq_id") is not None else s["session_id"]
        for b in s["block_table"]:
            owners.setdefault(str(b), []).append(who)
    out["owners"] = owners
    if auth:
        out["others"] = {"chats": len(others), "blocks": len(other_blocks)}
        own_rids = {s.get("request_id") for s in kept}
        out["preemption_events"] = [
            e if e.get("request_id") in own_rids else {**e, "request_id": None, "seq_id": None}
            for e in snap.get("preemption_events", [])
        ]
        out["tier_events"] = [  # another user's load: counted, never named
            e
            if e.get("request_id") in own_rids
            else {**e, "request_id": None, "seq_id": None, "session_id": None}
            for e in snap.get("tier_events", [])
        ]
        mine_pin = pin_name_for(viewer)
        out["pins"] = [
            p if p["name"] in (PIN_APP, mine_pin) else {**p, "name": "another user's prompt"}
            for p in snap.get("pins", [])
        ]
        own_ids = {
            str(s[k]) for s in kept for k in ("seq_id", "session_id") if s.get(k) is not None
        }
        out["state_slots"] = [  # a linear-attention state slot (v9): others' holders unnamed
            {
                **v,
                "holders": [
                    h if h == "checkpoint" or str(h) in own_ids else "another chat"
                    for h in v["holders"]
                ],
            }
            for v in snap.get("state_slots", [])
        ]
    return out


def titles_for(storage, viewer: str | None, auth: bool) -> dict:
    """conversation id -> title of what this viewer may see."""
    if storage is None:
        return {}
    rows = storage.list_conversations(owner=viewer if auth else None)
    return {r["id"]: r["title"] for r in rows}
