"""View-model of the KV dashboard: plain functions of one engine snapshot (see engine snapshot()).

Nothing here guesses: every number is read from, or counted in, the snapshot it is given, so a
rendered tick can be checked against that same snapshot. HTML lives in ui/dashboard/panels.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.observe.savings import sharing_savings  # noqa: F401  (V.sharing_savings: the headline's)
from ui.dashboard.kv_math import blocks_for, fmt_bytes
from ui.dashboard.vocabulary import CODES as V_CODES, NAMES as V_NAMES, state_of

MAX_CELLS = 4096  # more blocks than this: one cell stands for several blocks
KINDS = (
    V_CODES  # free, cached, private (ref 1), shared (ref >= 2), pinned: ui/dashboard/vocabulary.py
)
KIND_NAMES = V_NAMES


@dataclass(frozen=True)
class Cell:
    first: int  # first block id in the cell
    last: int  # last block id (== first unless aggregated)
    kind: str  # one of KINDS; aggregated cells: the most common kind
    label: str  # ref_count of a shared block (max ref_count when aggregated)
    title: str  # hover text
    mix: tuple | None = None  # aggregated: block counts per kind, in KINDS order


def owners_by_block(snap: dict) -> dict[int, list]:
    """Owners keyed by int block id (JSON round trips turn the keys into strings)."""
    return {int(k): v for k, v in (snap.get("owners") or {}).items()}


def conversation_key(seq: dict) -> str:
    return str(seq["session_id"] if seq.get("session_id") is not None else seq["seq_id"])


def owner_names(snap: dict) -> dict:
    """seq_id / session_id as they appear in owners -> the conversation name shown to users."""
    names = {}
    for s in snap.get("sequences", []):
        shown = s.get("title") or conversation_key(s)
        if s.get("seq_id") is not None:
            names[s["seq_id"]] = shown
        if s.get("session_id") is not None and s.get("seq_id") is None:
            names[s["session_id"]] = shown
    return names


def _holders(who: list, names: dict, shown: int = 3) -> str:
    """'a, b, c and 13 more': a cell's hover text stays short whatever its refcount (tick bytes)."""
    head = ", ".join(str(names.get(o, o)) for o in who[:shown])
    return head + (f" and {len(who) - shown} more" if len(who) > shown else "")


def kind_of(state: str, ref: int) -> str:
    return state_of(state, ref)


def grid_model(snap: dict, max_cells: int = MAX_CELLS) -> dict:
    """Cells of the block grid; aggregates ceil(num_blocks / max_cells) blocks per cell if needed."""
    blocks = snap["blocks"]
    states, refs, filled = blocks["state"], blocks["ref_count"], blocks["filled"]
    n, bs = len(states), snap["block_size"]
    per = max(1, blocks_for(n, max_cells))
    owners, names = owners_by_block(snap), owner_names(snap)
    kinds = [kind_of(st, r) for st, r in zip(states, refs)]
    cells = []
    if per == 1:
        for i, k in enumerate(kinds):
            if k == "f":
                cells.append(Cell(i, i, k, "", f"block {i} · free"))
                continue
            who = owners.get(i, [])
            title = (
                f"block {i} · {KIND_NAMES[k]} · ref_count {refs[i]} · {filled[i]}/{bs} tokens"
                + (" · held by " + _holders(who, names) if who else "")
            )
            cells.append(Cell(i, i, k, str(refs[i]) if k in "sn" and refs[i] >= 2 else "", title))
    else:
        for first in range(0, n, per):
            last = min(n, first + per) - 1
            group = kinds[first : last + 1]
            mix = tuple(group.count(k) for k in KINDS)
            # the most common kind; ties go to the more interesting one (shared > private > ...)
            kind = max(range(len(KINDS)), key=lambda j: (mix[j], j))
            top = max(refs[first : last + 1])
            title = (
                f"blocks {first}-{last} · "
                + ", ".join(f"{c} {KIND_NAMES[k].split(' ')[0]}" for c, k in zip(mix, KINDS) if c)
                + (f" · max ref_count {top}" if top else "")
            )
            cells.append(Cell(first, last, KINDS[kind], str(top) if top >= 2 else "", title, mix))
    counts = {k: kinds.count(k) for k in KINDS}
    return {
        "num_blocks": n,
        "per_cell": per,
        "cells": cells,
        "counts": counts,
        "aggregated": per > 1,
    }


class LazyTable(Sequence):
    """A block table's annotated entries ({logical, physical, shared, ref_count, filled}), built
    when read. Why: the page shows one selected table in full and 10 ids per other row; building
    a dict per entry of every table each tick cost ~100 ms at 350k blocks / 256 conversations."""

    __slots__ = ("ids", "shared", "refs", "filled", "states")

    def __init__(self, ids, shared, refs, filled, states=None):
        self.ids, self.shared, self.refs, self.filled, self.states = (
            ids,
            shared,
            refs,
            filled,
            states,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self.ids)))]
        b = self.ids[j]  # IndexError ends iteration
        j = j % len(self.ids)
        return {
            "logical": j,
            "physical": b,
            "shared": bool(self.shared[j]),
            "ref_count": self.refs[b],
            "filled": self.filled[b],
            "state": self.states[b] if self.states is not None else "used",
        }


def conversations(snap: dict) -> list[dict]:
    """Every live sequence / idle session, with its block table annotated."""
    bs = snap["block_size"]
    refs, filled = snap["blocks"]["ref_count"], snap["blocks"]["filled"]
    out = []
    for s in snap.get("sequences", []):
        table = list(s["block_table"])
        last_fill = s["last_block_filled"] if table else 0
        out.append(
            {
                "key": conversation_key(s),
                "label": s.get("title") or conversation_key(s),
                "seq_id": s.get("seq_id"),
                "session_id": s.get("session_id"),
                "request_id": s.get("request_id"),
                "state": s["state"],
                "num_tokens": s["num_tokens"],
                "num_computed": s["num_computed"],
                "num_blocks": len(table),
                "shared_blocks": sum(1 for x in s["shared"] if x),
                "last_block_filled": last_fill,
                "frag_tokens": (bs - last_fill) if table else 0,
                "table": LazyTable(table, s["shared"], refs, filled, snap["blocks"].get("state")),
                "group_blocks": s.get("group_blocks"),  # live blocks per KV cache group, in order
            }
        )
    out.sort(key=lambda c: (c["state"] != "running", c["key"]))
    return out


def choices(convs: list[dict]) -> list[tuple[str, str]]:
    """(title shown, key) per conversation, for the highlight picker: titles, not ids."""
    return sorted({(c["label"], c["key"]) for c in convs})


def highlight_blocks(convs: list[dict], key: str | None) -> frozenset:
    if not key:
        return frozenset()
    return frozenset(b for c in convs if c["key"] == key for b in c["table"].ids)


def headline(
    snap: dict, hit_last_min: float | None = None, tokens_per_s: float | None = None
) -> list[dict]:
    """The numbers at the top, each as {key, label, value (raw), text, sub}; `key` names the stat."""
    st = snap["stats"]
    bs, bpb = st["block_size"], st["kv_bytes_per_block"]
    sav = sharing_savings(snap)
    q, h = st["prefix_cache_queries"], st["prefix_cache_hits"]
    free_tok = st["free_blocks"] * bs
    used_slots = st["used_blocks"] * bs
    frag = st["internal_fragmentation_tokens"]
    contiguous = sav["contiguous_blocks"]
    n_state = {
        "shared": st["shared_blocks"],
        "pinned": st.get("pinned_blocks", 0),
    }  # = the grid's colours

    def item(key, label, value, text, sub=""):
        return {"key": key, "label": label, "value": value, "text": text, "sub": sub}

    pct = lambda x: "–" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    return [
        item(
            "used_blocks",
            "Blocks used",
            st["used_blocks"],
            f"{st['used_blocks']:,} / {st['total_blocks']:,}",
            f"{pct(st['used_blocks'] / st['total_blocks'])} · {fmt_bytes(st['used_blocks'] * bpb)}"
            f" of {fmt_bytes(st['total_blocks'] * bpb)} · peak {st['peak_used_blocks']:,}"
            + (
                f" · {st.get('pinned_blocks', 0):,} of them pinned"
                if st.get("pinned_blocks")
                else ""
            ),
        ),
        item(
            "kv_capacity_tokens",
            "KV capacity",
            st["kv_capacity_tokens"],
            f"{st['kv_capacity_tokens']:,} tok",
            f"{bs} tokens/block · {fmt_bytes(bpb)}/block",
        ),
        item(
            "used_tokens",
            "Used tokens",
            st["used_tokens"],
            f"{st['used_tokens']:,} tok",
            f"{fmt_bytes(st['used_tokens'] * st['kv_bytes_per_token'])} of real KV",
        ),
        item(
            "free_tokens",
            "Free tokens",
            free_tok,
            f"{free_tok:,} tok",
            f"{st['free_blocks']:,} free blocks, {st['cached_blocks']:,} of them cached",
        ),
        item(
            "shared_blocks",
            "Shared blocks",
            n_state["shared"],
            f"{n_state['shared']:,}",
            "held by 2+ chats (pinned ones count as pinned)",
        ),
        item(
            "pinned_blocks",
            "Pinned blocks",
            n_state["pinned"],
            f"{n_state['pinned']:,}",
            "the shared system prompt, stored once, never evicted",
        ),
        item(
            "saved_blocks",
            "Saved by sharing",
            sav["saved_blocks"],
            f"{sav['saved_blocks']:,} blocks",
            f"{fmt_bytes(sav['saved_bytes'])} · {sav['ref_sum']:,} table entries − {sav['used_blocks']:,} "
            "blocks held",
        ),
        item(
            "savings_vs_unshared",
            "vs paging w/o sharing",
            st["savings_vs_unshared"],
            pct(st["savings_vs_unshared"]),
            f"it would need {st['logical_blocks']:,} blocks",
        ),
        item(
            "savings_vs_contiguous",
            "vs contiguous max-len",
            st["savings_vs_contiguous"],
            pct(st["savings_vs_contiguous"]),
            ""
            if contiguous is None
            else f"{contiguous:,} blocks ({fmt_bytes(contiguous * bpb)}) at {st['max_model_len']:,} tok/seq",
        ),
        item(
            "internal_fragmentation_tokens",
            "Internal fragmentation",
            frag,
            f"{frag:,} tok",
            f"{pct(frag / used_slots if used_slots else 0.0)} of used slots · "
            f"{fmt_bytes(frag * st['kv_bytes_per_token'])}",
        ),
        item(
            "hit_rate_run",
            "Prefix hit rate (run)",
            h / q if q else None,
            pct(h / q if q else None),
            f"reused from cache: {h:,} of {q:,} prompt tokens",
        ),
        item(
            "hit_rate_minute",
            "Prefix hit rate (1 min)",
            hit_last_min,
            pct(hit_last_min),
            "last 60 s" if hit_last_min is not None else "no prompt in the last 60 s",
        ),
        item(
            "running",
            "Running / waiting",
            st["running"],
            f"{st['running']} / {st['waiting']}",
            f"peak {st['peak_running']} · {st['num_idle_sessions']} idle sessions",
        ),
        item(
            "num_preemptions",
            "Preemptions",
            st["num_preemptions"],
            f"{st['num_preemptions']:,}",
            "requests evicted, KV recomputed later",
        ),
        item(
            "tokens_per_s",
            "Throughput",
            tokens_per_s,
            "–" if tokens_per_s is None else f"{tokens_per_s:,.1f} tok/s",
            f"{st['generated_tokens_total']:,} generated in total",
        ),
    ]


def preemption_rows(snap: dict, last: int = 5) -> list[dict]:
    return [
        {
            "request_id": e.get("request_id"),
            "seq_id": e.get("seq_id"),
            "tokens_recomputed": e.get("tokens_lost"),
            "time": e.get("time"),
        }
        for e in list(snap.get("preemption_events") or [])[-last:][::-1]
    ]


def consistency_problems(snap: dict) -> list[str]:
    """Check a snapshot against itself: stats vs per-block arrays vs block tables vs owners."""
    st, b = snap["stats"], snap["blocks"]
    bad = []

    def check(name, got, want):
        if got != want:
            bad.append(f"{name}: counted {got}, stats say {want}")

    held = ("used", "pinned")
    pins = snap.get("pins") or []
    check("used_blocks", sum(1 for s in b["state"] if s in held), st["used_blocks"])
    check("free_blocks", sum(1 for s in b["state"] if s not in held), st["free_blocks"])
    check("pinned_blocks", sum(1 for s in b["state"] if s == "pinned"), st.get("pinned_blocks", 0))
    check("cached_blocks", sum(1 for s in b["state"] if s == "cached"), st["cached_blocks"])
    check(
        "shared_blocks",
        sum(1 for s, r in zip(b["state"], b["ref_count"]) if r >= 2 and s != "pinned"),
        st["shared_blocks"],
    )
    check(
        "used_tokens", sum(f for f, r in zip(b["filled"], b["ref_count"]) if r), st["used_tokens"]
    )
    check(
        "logical_blocks",
        sum(len(s["block_table"]) for s in snap["sequences"]),
        st["logical_blocks"],
    )
    check(
        "ref_sum",
        sum(b["ref_count"]),
        st["logical_blocks"] + sum(len(p["block_table"]) for p in pins),
    )
    owners = owners_by_block(snap)
    for p in pins:  # a pin is one more holder (the app)
        for blk in p["block_table"]:
            owners.setdefault(int(blk), []).append(f"pin:{p['name']}")
    for i, r in enumerate(b["ref_count"]):
        if len(owners.get(i, [])) != r:
            bad.append(f"block {i}: ref_count {r} but {len(owners.get(i, []))} owners")
    return bad
