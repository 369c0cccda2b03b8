"""One name and one colour per block state, for every panel of the Memory tab (issue 26.5).

Why its own module: the headline, the tiles, the grid's legend, the grid itself, the block
tables and the event feed each named and coloured blocks on their own, and a newcomer saw them
disagree on one screen ("shared blocks 34" beside a legend "shared: 0, pinned: 34"; the same
blocks purple in the grid and orange in the table). Here is the one rule: every block is in
exactly one state, checked in this order,

  pinned   held by the app's pin of the shared system prompt (whatever its ref_count)
  shared   held by two or more block tables (ref_count >= 2), not pinned
  private  held by one block table (ref_count 1)
  cached   free, but still holding a reusable prefix (a later prompt can revive it)
  free     free and empty

so the five counts add up to the pool, "used" = pinned + shared + private, and each panel reads
its names, colours and counts from here. The comparison bars of the headline are not block
states and use colours of their own (BAR_COLORS), never a state's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockState:
    code: str  # one letter, as in the grid payload and view.KINDS
    name: str  # the one word every panel uses
    meaning: str  # what it means, for legends' hover text and the docs
    light: str  # colour, light theme
    dark: str  # colour, dark theme


STATES = (
    BlockState("f", "free", "free and empty", "#e5e7eb", "#374151"),
    BlockState("c", "cached", "free, still holding a reusable prefix", "#99f6e4", "#115e59"),
    BlockState("p", "private", "held by one chat (ref_count 1)", "#60a5fa", "#2563eb"),
    BlockState(
        "s", "shared", "held by 2 or more chats (ref_count ≥ 2), not pinned", "#f97316", "#ea580c"
    ),
    BlockState("n", "pinned", "the shared system prompt, pinned by the app", "#7c3aed", "#a78bfa"),
)
BY_CODE = {s.code: s for s in STATES}
CODES = tuple(s.code for s in STATES)
NAMES = {s.code: s.name for s in STATES}
CSS_VAR = {s.code: f"var(--kv-{s.name})" for s in STATES}
# what the comparison bars show (not block states): colours no state uses
BAR_COLORS = {
    "used": ("#0f766e", "#2dd4bf"),
    "unshared": ("#94a3b8", "#64748b"),
    "contig": ("#d4d4d8", "#52525b"),
    "nowindow": ("#cbd5e1", "#475569"),
}
# KV cache groups by layer kind (issue 45): the grid's "colour by layer kind" view, its legend and
# the groups table. A kind is global (full attention) or local with its window; colours no block
# state and no bar uses, so a cell never reads as a state in that view. More kinds than colours
# reuse them in order.
KIND_COLORS = (
    ("#db2777", "#f472b6"),
    ("#ca8a04", "#facc15"),
    ("#65a30d", "#a3e635"),
    ("#0e7490", "#22d3ee"),
)


def state_of(state: str, ref_count: int) -> str:
    """The one state code of a block, from the snapshot's per-block state and ref_count."""
    if state == "pinned":
        return "n"
    if ref_count >= 2:
        return "s"
    if ref_count == 1:
        return "p"
    return "c" if state == "cached" else "f"


def counts(snap: dict) -> dict[str, int]:
    """{name: blocks} for one snapshot, every block counted once (sums to total_blocks)."""
    b = snap["blocks"]
    out = {s.name: 0 for s in STATES}
    for st, ref in zip(b["state"], b["ref_count"]):
        out[NAMES[state_of(st, ref)]] += 1
    return out


def theme_vars(dark: bool) -> dict[str, str]:
    """--kv-<name> values of one theme: the five states and the bars."""
    out = {s.name: (s.dark if dark else s.light) for s in STATES}
    out.update({f"bar-{k}": v[1 if dark else 0] for k, v in BAR_COLORS.items()})
    out.update({f"kind-{i}": v[1 if dark else 0] for i, v in enumerate(KIND_COLORS)})
    return out
