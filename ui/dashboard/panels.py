"""HTML for the dashboard panels, built from the view-model in ui/dashboard/view.py.

Strings only (no Gradio): lean markup for thousands of grid cells, one CSS block passed to each
gr.HTML as css_template (so the page needs no global CSS). Every headline number carries its raw
value in data-v, which the accuracy tests read back.
"""

from __future__ import annotations

from html import escape

from ui.dashboard.groups_view import GROUPS_CSS, table_groups
from ui.dashboard.state_view import STATE_CSS
from ui.dashboard.story import STORY_CSS
from ui.dashboard.view import KIND_NAMES, KINDS
from ui.dashboard.vocabulary import CSS_VAR, NAMES, state_of, theme_vars
from ui.dashboard.kv_math import PRESETS, ModelShape, batch_table, block_size_whatif, fmt_bytes

# Colours are CSS variables, set per theme by THEME_CSS (global: the app passes it to Gradio with
# its own CSS, because a component's css_template is scoped and cannot see the `.dark` class).
COLORS = CSS_VAR
LIGHT = {**theme_vars(dark=False), "contig": "#9ca3af", "track": "#f3f4f6", "outline": "#111827"}
DARK = {**theme_vars(dark=True), "contig": "#6b7280", "track": "#1f2937", "outline": "#f9fafb"}
THEME_CSS = (
    ":root { " + " ".join(f"--kv-{k}: {v};" for k, v in LIGHT.items()) + " }\n"
    ".dark { " + " ".join(f"--kv-{k}: {v};" for k, v in DARK.items()) + " }\n"
)
BAND_MIN = 24  # a run of at least this many free / cached-free blocks is drawn as one band

CSS = (
    """
.kv-asof { float: right; margin-left: 8px; font-size: 11px; font-variant-numeric: tabular-nums;
  color: var(--body-text-color-subdued, #6b7280); }
.kv-asof.old { color: #b91c1c; font-weight: 600; }
.kvd { font-size: 13px; line-height: 1.35; color: var(--body-text-color, #111); }
.kvd h4 { margin: 6px 0 4px; font-size: 14px; }
.kvd .muted { color: var(--body-text-color-subdued, #6b7280); font-size: 12px; }
.kvd table { border-collapse: collapse; margin: 4px 0; }
.kvd th, .kvd td { border-bottom: 1px solid var(--border-color-primary, #e5e7eb); padding: 2px 8px;
  text-align: right; white-space: nowrap; }
.kvd th:first-child, .kvd td:first-child { text-align: left; }
.kvd tr.cur td { font-weight: 600; background: rgba(249, 115, 22, 0.12); }
.kvg { display: grid; grid-template-columns: repeat(auto-fill, 13px); gap: 1px; }
.kvg i { width: 13px; height: 13px; font: 600 8px/13px sans-serif; text-align: center;
  color: #fff; font-style: normal; overflow: hidden; border-radius: 2px; }
.kvg i.f { background: var(--kv-free); } .kvg i.c { background: var(--kv-cached); }
.kvg i.p { background: var(--kv-private); } .kvg i.s { background: var(--kv-shared); }
.kvg i.n { background: var(--kv-pinned); }
.kvg i.h { outline: 2px solid var(--kv-outline); outline-offset: -2px; box-shadow: 0 0 0 1px #facc15; }
.kvg i.band { grid-column: 1 / -1; width: auto; height: 15px; font: 500 11px/15px sans-serif;
  color: var(--body-text-color, #111); text-align: left; padding-left: 6px; }
.kvf ul { margin: 2px 0; padding-left: 18px; } .kvf li { margin: 1px 0; }
.kvl { display: flex; flex-wrap: wrap; gap: 14px; margin: 6px 0; align-items: center; }
.kvl span b { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin-right: 4px; }
.kvgrps { display: grid; grid-template-columns: repeat(auto-fit, minmax(270px, 1fr)); gap: 4px 12px; }
.kvn { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 4px; }
.kvn > div { border: 1px solid var(--border-color-primary, #e5e7eb); border-radius: 6px; padding: 3px 7px; }
.kvn .l { font-size: 11px; color: var(--body-text-color-subdued, #6b7280); }
.kvn .v { font-size: 16px; font-weight: 700; line-height: 1.25; }
.kvn .s { font-size: 11px; line-height: 1.25; color: var(--body-text-color-subdued, #6b7280); }
/* a table wider than its panel scrolls inside it, and says so: a shadow on the side with more */
.kvd .scroll, .kv-tier .scroll { overflow-x: auto; max-width: 100%;
  background: linear-gradient(to right, var(--body-background-fill, #fff) 30%, transparent),
    linear-gradient(to left, var(--body-background-fill, #fff) 30%, transparent),
    radial-gradient(farthest-side at 0 50%, rgba(0,0,0,.25), transparent),
    radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,.25), transparent);
  background-repeat: no-repeat; background-size: 40px 100%, 40px 100%, 12px 100%, 12px 100%;
  background-position: left center, right center, left center, right center;
  background-attachment: local, local, scroll, scroll; }
.kvf ul { max-height: 150px; overflow-y: auto; }
.kv-tier table { border-collapse: collapse; font-size: 13px; }
.kv-tier th, .kv-tier td { padding: 2px 10px 2px 0; text-align: left; white-space: normal;
  border-bottom: 1px solid var(--border-color-primary, #e5e7eb); }
.kvwho table { font-size: 12px; } .kvwho th, .kvwho td { padding: 2px 6px; }
.kv-tier th { font-weight: 500; color: var(--body-text-color-subdued, #6b7280); }
.kvt { display: flex; flex-wrap: wrap; gap: 3px; margin: 4px 0; }
.kvt span { border-radius: 3px; padding: 1px 5px; font: 11px monospace; background: #60a5fa; color: #fff; }
.kvt span { background: var(--kv-private); }
.kvt span.s { background: var(--kv-shared); } .kvt span.n { background: var(--kv-pinned); }
.kvt span.last { outline: 2px dashed var(--kv-outline); }
.kvt span.r, .kv-reasoning .r-mark { box-shadow: inset 0 -4px 0 #facc15; }
.kv-reasoning .r-mark { display: inline-block; width: 12px; height: 10px; margin-right: 4px;
  vertical-align: -1px; background: var(--kv-private); border-radius: 2px; }
.kvd code { font-size: 12px; }
.kvgrp { margin-bottom: 2px; } .kvgrp h4 { margin: 2px 0 2px; font-size: 12px; font-weight: 600;
  color: var(--body-text-color-subdued, #6b7280); }
"""
    + STORY_CSS
    + GROUPS_CSS
    + STATE_CSS
)


STATE_WORDS = {"running": "running", "idle_session": "between turns"}
STATE_TIP = (
    "running: in the batch now; between turns: a chat waiting for its next message, its blocks "
    "kept so the next turn prefills only the new tokens (an idle session)"
)
TABLE_SHARED_TIP = "Blocks of this table held by another chat too, or pinned (ref_count >= 2)"


def _table_state(e: dict) -> str:
    """The block-table entry's state code ("n" pinned / "s" shared / "p" private), as in the grid."""
    return state_of(e.get("state", "used"), e["ref_count"]) if e["ref_count"] else "p"


def _table_counts(sel: dict) -> str:
    codes = [_table_state(e) for e in sel["table"]]
    return ", ".join(f"{codes.count(c)} {NAMES[c]}" for c in ("n", "s", "p") if codes.count(c))


def _swatch(kind: str) -> str:
    return f'<b style="background:{COLORS[kind]}"></b>'


def _cells_html(cells, highlight: frozenset) -> list[str]:
    """One <i> per cell, except runs of >= BAND_MIN free / cached-free cells: one counted band
    (a 350k-block pool is mostly such runs; drawing them cell by cell is what made the page slow)."""
    parts, i, n = [], 0, len(cells)
    while i < n:
        c = cells[i]
        if c.kind in "fc" and c.first == c.last:
            j = i
            while j < n and cells[j].kind == c.kind and cells[j].first == cells[j].last:
                j += 1
            if j - i >= BAND_MIN:
                what = NAMES[c.kind]
                parts.append(
                    f'<i class="band {c.kind}" data-band="{j - i}">{j - i:,} {what} blocks '
                    f'(#{c.first:,}–#{cells[j - 1].last:,})</i>'
                )
                i = j
                continue
        hl = highlight and any(b in highlight for b in range(c.first, c.last + 1))
        cls = c.kind + " h" if hl else c.kind
        # hover text only where it says more than the colour (shared, pinned, aggregated, selected):
        # a title on every private cell tripled the bytes of a tick
        tip = f' title="{escape(c.title)}"' if (c.kind in "sn" or hl) else ""
        parts.append(
            f'<i class={cls}{tip}>{c.label}</i>'
            if " " not in cls
            else f'<i class="{cls}"{tip}>{c.label}</i>'
        )
        i += 1
    return parts


def grid_html(grid: dict, highlight: frozenset = frozenset()) -> str:
    cells = grid["cells"]
    parts = _cells_html(cells, highlight)
    n, per, counts = grid["num_blocks"], grid["per_cell"], grid["counts"]
    legend = "".join(
        f'<span>{_swatch(k)}{KIND_NAMES[k]}: '
        f'<span data-k="cells_{k}" data-v="{counts[k]}">{counts[k]:,}</span></span>'
        for k in KINDS
    )
    hl_note = (
        f'<span><b style="outline:2px solid var(--kv-outline)"></b>selected conversation '
        f'({len(highlight)} blocks)</span>'
        if highlight
        else ""
    )
    scale = (
        f"{n:,} blocks, one cell per block; the number in a shared cell is its ref_count"
        if per == 1
        else f"{n:,} blocks, more than the grid shows: each cell aggregates {per} blocks (colour = the "
        f"most common state, number = highest ref_count; hover for counts)"
    )
    return (
        f'<div class="kvd"><div class="kvl">{legend}{hl_note}</div>'
        f'<div class="muted" data-k="per_cell" data-v="{per}">{scale}</div>'
        f'<div class="kvg">{"".join(parts)}</div></div>'
    )


TILE_GROUPS = (  # what each tile explains; shown under the headline in this order, side by side
    (
        "Pool",
        (
            "used_blocks",
            "kv_capacity_tokens",
            "used_tokens",
            "free_tokens",
            "internal_fragmentation_tokens",
        ),
    ),
    (
        "Sharing",
        (
            "pinned_blocks",
            "shared_blocks",
            "saved_blocks",
            "savings_vs_unshared",
            "savings_vs_contiguous",
        ),
    ),
    (
        "Prefix cache · scheduler",
        ("hit_rate_run", "hit_rate_minute", "running", "num_preemptions", "tokens_per_s"),
    ),
)
# one line on hover for every tile: what a newcomer needs to read it (issue 47)
TILE_TIPS = {
    "used_blocks": "Blocks of the pool that hold KV now (pinned + shared + private), of all there are.",
    "kv_capacity_tokens": "How many tokens of KV the whole pool can hold: blocks x tokens per block.",
    "used_tokens": "Token slots in used blocks that hold real KV (a block's last slots may be empty).",
    "free_tokens": "Token slots in free blocks; cached ones still hold a prefix a later prompt can reuse.",
    "internal_fragmentation_tokens": "Slots allocated but empty: the unfilled end of each chat's last block.",
    "pinned_blocks": "pinned: blocks of the shared system prompt, stored once and kept by the app for every chat.",
    "shared_blocks": "shared: blocks held by 2 or more chats at once (ref_count >= 2); pinned ones count as pinned.",
    "saved_blocks": "saved by sharing: the block-table entries of the live chats (what paging without sharing "
    "would store) minus the blocks they hold.",
    "savings_vs_unshared": "1 - blocks used / blocks paging without sharing would need.",
    "savings_vs_contiguous": "1 - blocks used / blocks a contiguous cache would reserve (max length per chat).",
    "hit_rate_run": "reused from cache: prompt tokens found in the prefix cache (or the KV tier) instead of "
    "computed, since start.",
    "hit_rate_minute": "The same over the last 60 seconds ('–': no prompt in that time).",
    "running": "Requests in the batch now / waiting for a slot; idle sessions are chats parked between turns "
    "with their blocks kept.",
    "num_preemptions": "Requests whose blocks were taken for others; their KV is recomputed (or loaded from "
    "the KV tier) when they resume.",
    "tokens_per_s": "Tokens generated per second, all requests, over the last few seconds.",
}


def _tile(it: dict) -> str:
    v = "" if it["value"] is None else it["value"]
    tip = TILE_TIPS.get(it["key"], "")
    return (
        f'<div data-k="{it["key"]}" data-v="{v}" title="{escape(tip, quote=True)}">'
        f'<div class="l">{escape(it["label"])}</div>'
        f'<div class="v">{escape(it["text"])}</div><div class="s">{escape(it["sub"])}</div></div>'
    )


def headline_html(items: list[dict], preemptions: list[dict]) -> str:
    """The tiles, grouped by what they explain (pool, sharing, cache, scheduler)."""
    by_key = {it["key"]: it for it in items}
    groups, placed = [], set()
    for title, keys in TILE_GROUPS:
        tiles = [by_key[k] for k in keys if k in by_key]
        placed.update(k for k in keys if k in by_key)
        if tiles:
            groups.append(
                f'<div class="kvgrp"><h4>{title}</h4><div class="kvn">'
                f'{"".join(_tile(t) for t in tiles)}</div></div>'
            )
    rest = [it for it in items if it["key"] not in placed]
    if rest:
        groups.append(
            f'<div class="kvgrp"><h4>Other</h4><div class="kvn">{"".join(_tile(t) for t in rest)}</div></div>'
        )
    if preemptions:
        ev = "; ".join(
            f"{escape(str(e['request_id']))} ({escape(str(e['seq_id']))}): "
            f"{e['tokens_recomputed']} tokens to recompute"
            for e in preemptions
        )
        pre = f'<div class="muted">Last preemptions (newest first): {ev}</div>'
    else:
        pre = ""
    return f'<div class="kvd"><div class="kvgrps">{"".join(groups)}</div>{pre}</div>'


def reasoning_line(span, marked: int) -> str:
    """Under a thinking chat's block table: which of its private blocks hold its last reasoning."""
    if span is None or not marked:
        return ""
    where = (
        f"block {span.first_block}"
        if span.first_block == span.last_block
        else f"blocks {span.first_block}–{span.last_block}"
    )
    return (
        f'<div class="muted kv-reasoning" data-k="reasoning_blocks" data-v="{marked}">'
        f'<i class="r-mark"></i>Its last reply\'s reasoning: {span.tokens:,} token'
        f'{"s" if span.tokens != 1 else ""} in {marked} private '
        f'block{"s" if marked != 1 else ""} '
        f'(logical {where}), kept until the next message</div>'
    )


def _table_cells(sel: dict, block_size: int, reasoning, group_names) -> tuple[str, int]:
    """The selected table's cells, group by group (a local group lists only the blocks still in its
    window; the others were given back), each cell 'logical→#physical'; and how many are marked as
    the last reply's reasoning."""
    split = table_groups(sel, block_size)
    out, marked, at = [], 0, 0
    for g in split:
        if len(split) > 1:
            name = group_names[g["group"]] if group_names and g["group"] < len(group_names) else ""
            gone = f", {g['first_logical']} given back" if g["first_logical"] else ""
            n = g["count"]
            out.append(
                f'<div class="gname" data-k="table_group_{g["group"]}" data-v="{n}">group '
                f'{g["group"]} · {escape(name)}: {n} block{"s" if n != 1 else ""}'
                f'{gone}</div>'
            )
        for k in range(g["count"]):
            e, logical = sel["table"][at + k], g["first_logical"] + k
            last = logical == g["first_logical"] + g["count"] - 1
            fill = f' {sel["last_block_filled"]}/{block_size}' if last else ""
            cls = _table_state(e) + (" last" if last else "")
            if reasoning is not None and reasoning.first_block <= logical <= reasoning.last_block:
                cls += " r"
                marked += 1
            tip = (
                f"logical {logical} -> physical {e['physical']} · ref_count {e['ref_count']}"
                f" · {e['filled']}/{block_size} tokens"
            )
            out.append(
                f'<span class="{cls.strip()}" title="{tip}">{logical}→#{e["physical"]}'
                f'{"×" + str(e["ref_count"]) if e["shared"] else ""}{fill}</span>'
            )
        at += g["count"]
    return "".join(out), marked


def tables_html(
    convs: list[dict],
    selected: str | None,
    block_size: int,
    max_rows: int = 24,
    reasoning=None,
    group_names=None,
    state_note: str = "",
) -> str:
    """The selected chat's block table in full (`reasoning`: its last reasoning's span, marked;
    `group_names`: each KV cache group's layer kind; `state_note`: the state slot a chat of a
    linear-attention model holds beside its blocks, state_view.chat_state_note), then every live
    table in short."""
    out = ['<div class="kvd">']
    sel = next((c for c in convs if c["key"] == selected), None)
    if sel is None and selected:
        out.append(
            '<div class="muted">That conversation holds no blocks now (finished or closed).</div>'
        )
    elif sel is None:
        out.append(
            '<div class="muted">Pick a conversation above to see its block table and '
            'highlight its blocks in the grid.</div>'
        )
    else:
        cells, marked = _table_cells(sel, block_size, reasoning, group_names)
        out.append(
            f'<h4>Block table of {escape(sel["label"])} <span class="muted">({STATE_WORDS.get(sel["state"], sel["state"])}'
            f'{", " + escape(str(sel["request_id"])) if sel["request_id"] else ""})</span></h4>'
            f'<div class="muted">{sel["num_computed"]:,} tokens with KV in {sel["num_blocks"]} blocks'
            f'{escape(state_note)}, '
            f'{_table_counts(sel)} (×ref_count where 2 or more); last block '
            f'{sel["last_block_filled"]}/{block_size} filled → {sel["frag_tokens"]} slots of internal '
            f'fragmentation</div><div class="kvt">{cells}</div>{reasoning_line(reasoning, marked)}'
        )
    out.append(
        f'<h4>All live block tables ({len(convs)})</h4><div class="scroll"><table><tr><th>conversation</th>'
        f'<th title="{STATE_TIP}">state</th><th>request</th><th>tokens</th><th>blocks</th>'
        f'<th title="{TABLE_SHARED_TIP}">shared</th><th title="Tokens in the last block, of its size: '
        f'the rest is internal fragmentation">last block</th><th title="The block table: each logical '
        f'block of the chat and the physical block of the pool that holds it (the first 10)">logical → '
        f'physical</th></tr>'
    )
    for c in convs[:max_rows]:
        ids = [("<b>%d</b>" if e["shared"] else "%d") % e["physical"] for e in c["table"][:10]]
        more = f" … +{c['num_blocks'] - 10}" if c["num_blocks"] > 10 else ""
        out.append(
            f'<tr class="{"cur" if c["key"] == selected else ""}"><td>{escape(c["label"])}</td>'
            f'<td>{STATE_WORDS.get(c["state"], escape(c["state"]))}</td><td>{escape(str(c["request_id"] or "–"))}</td>'
            f'<td>{c["num_computed"]:,}</td><td>{c["num_blocks"]}</td><td>{c["shared_blocks"]}</td>'
            f'<td>{c["last_block_filled"]}/{block_size}</td>'
            f'<td style="text-align:left"><code>[{", ".join(ids)}{more}]</code></td></tr>'
        )
    out.append("</table></div>")
    if len(convs) > max_rows:
        out.append(f'<div class="muted">… and {len(convs) - max_rows} more</div>')
    if not convs:
        out.append('<div class="muted">No live sequences or sessions.</div>')
    out.append(
        '<div class="muted">Bold ids are shared or pinned blocks (ref_count ≥ 2).</div></div>'
    )
    return "".join(out)


def _shape_row(m: ModelShape, live: bool) -> str:
    return (
        f'<tr class="{"cur" if live else ""}"><td>{escape(m.name)}</td><td>{m.layers}</td>'
        f'<td>{m.heads} / {m.kv_heads}</td><td>{m.head_dim}</td><td>{m.dtype}</td>'
        f'<td data-k="bpt_{escape(m.name)}" data-v="{m.bytes_per_token}">{m.bytes_per_token:,} B</td>'
        f'<td>{m.mha_bytes_per_token:,} B</td><td>{m.gqa_factor:.1f}×</td>'
        f'<td>{m.max_len:,}</td><td>{fmt_bytes(m.max_len * m.bytes_per_token)}</td></tr>'
    )


def kv_dtype_gain_html(m: ModelShape, pool_bytes: int) -> str:
    """What a KV cache smaller than the weights' dtype buys, in the same bytes: "int8 KV: 11.95 KiB/token,
    171k tokens in 2 GiB — 1.9x what bfloat16 would hold". Empty when the KV dtype is the weights'."""
    if not m.weights_dtype or m.weights_dtype == m.dtype:
        return ""
    tokens, base = pool_bytes // m.bytes_per_token, pool_bytes // m.weights_bytes_per_token
    ratio = m.weights_bytes_per_token / m.bytes_per_token
    return (
        f'<div data-k="kv_dtype_gain" data-v="{ratio:.4f}"><b>{escape(m.dtype)} KV: '
        f'{fmt_bytes(m.bytes_per_token)}/token, {tokens:,} tokens in {fmt_bytes(pool_bytes)} — '
        f'{ratio:.2f}× what {escape(m.weights_dtype)} would hold</b> ({base:,} tokens at '
        f'{fmt_bytes(m.weights_bytes_per_token)}/token)</div>'
    )


def arithmetic_html(
    live: ModelShape,
    engine_bpt: int,
    block_size: int,
    num_blocks: int,
    avg_len: float | None,
    table_model: ModelShape | None = None,
) -> str:
    m = live
    pool = num_blocks * block_size * m.bytes_per_token
    mismatch = (
        ""
        if engine_bpt == m.bytes_per_token
        else f'<div style="color:#b91c1c">The engine reports {engine_bpt:,} B/token.</div>'
    )
    row = (
        f'({m.head_dim} head_dim × {m.dtype_bytes} B ({m.dtype}) + {m.scale_bytes} B scale)'
        if m.scale_bytes
        else f'{m.head_dim} head_dim × {m.dtype_bytes} B ({m.dtype})'
    )
    formula = (
        f'<h4>KV bytes per token ({escape(m.name)})</h4>'
        f'<div><code>2 (K,V) × {m.layers} layers × {m.kv_heads} KV heads × {row} = '
        f'<b data-k="bytes_per_token" data-v="{m.bytes_per_token}">'
        f'{m.bytes_per_token:,} B/token</b></code> ({fmt_bytes(m.bytes_per_token)})</div>'
        + kv_dtype_gain_html(m, pool)
        + f'<div><code>2 × {m.layers} × {m.heads} attention heads × {m.head_dim} × {m.dtype_bytes} B = '
        f'<span data-k="mha_bytes_per_token" data-v="{m.mha_bytes_per_token}">'
        f'{m.mha_bytes_per_token:,} B/token</span></code> if every attention head kept its own K/V: '
        f'grouped-query attention stores {m.gqa_factor:.1f}× less.</div>{mismatch}'
        f'<div>One {block_size}-token block: {fmt_bytes(block_size * m.bytes_per_token)} · pool: '
        f'{num_blocks:,} blocks × {block_size} tokens = {num_blocks * block_size:,} tokens = '
        f'{fmt_bytes(pool)} · one {m.max_len:,}-token sequence: {fmt_bytes(m.max_len * m.bytes_per_token)}</div>'
    )
    tm = table_model or m
    length = avg_len if avg_len else 256
    src = (
        f"the live average sequence length ({length:,.0f} tokens)"
        if avg_len
        else "256 tokens (no live sequences yet)"
    )
    rows = batch_table(tm, length, block_size, pool_bytes=pool if tm is m else None)
    body = "".join(
        f'<tr><td>{r["batch"]}</td><td>{fmt_bytes(r["traditional_bytes"])}</td>'
        f'<td>{100 * r["waste_traditional_frac"]:.1f}%</td><td>{fmt_bytes(r["paged_bytes"])}</td>'
        f'<td>{100 * r["waste_paged_frac"]:.1f}%</td><td>{100 * r["saved_frac"]:.1f}%</td>'
        + (
            f'<td>{"yes" if r["fits_traditional"] else "no"} / {"yes" if r["fits_paged"] else "no"}</td>'
            if r["fits_paged"] is not None
            else ""
        )
        + "</tr>"
        for r in rows
    )
    fits = "<th>fits pool (trad / paged)</th>" if tm is m else ""
    table = (
        f'<h4>Traditional vs paged: {escape(tm.name)} at {src}</h4>'
        f'<table><tr><th>batch</th><th>traditional (max {tm.max_len:,} tok)</th><th>wasted</th>'
        f'<th>paged ({block_size}-token blocks)</th><th>wasted</th><th>saved</th>{fits}</tr>{body}</table>'
    )
    presets = (
        '<h4>Well-known configs next to the live model</h4><table><tr><th>model</th>'
        '<th>layers</th><th>heads / KV heads</th><th>head_dim</th><th>dtype</th><th>KV/token</th>'
        '<th>if MHA</th><th>GQA saves</th><th>max len</th><th>one max-len seq</th></tr>'
        + _shape_row(m, True)
        + "".join(_shape_row(p, False) for p in PRESETS)
        + "</table>"
    )
    return f'<div class="kvd">{formula}<div class="scroll">{table}{presets}</div></div>'


def whatif_html(sequences: list[dict], block_size: int) -> str:
    rows = block_size_whatif(sequences, block_size)
    body = "".join(
        f'<tr class="{"cur" if r["current"] else ""}"><td>{r["block_size"]}{" (live)" if r["current"] else ""}</td>'
        f'<td>{r["table_entries"]:,}</td><td>{r["max_table_len"]:,}</td><td>{fmt_bytes(r["table_bytes"])}</td>'
        f'<td data-k="frag_{r["block_size"]}" data-v="{r["frag_tokens"]}">{r["frag_tokens"]:,}</td>'
        f'<td>{100 * r["frag_frac"]:.1f}%</td><td>{r["avg_waste_per_seq"]:.1f}</td></tr>'
        for r in rows
    )
    return (
        f'<div class="kvd"><div class="muted">{len(sequences)} live sequences/sessions, each counted on '
        f'its own (no sharing): smaller blocks waste less of the last block but need longer block '
        f'tables (int32 per entry) and more, smaller attention reads.</div>'
        f'<div class="scroll"><table><tr><th>block size</th><th>table entries</th><th>longest table</th>'
        f'<th>table memory</th><th>internal frag. (tok)</th><th>of allocated</th><th>avg waste/seq</th></tr>'
        f'{body}</table></div></div>'
    )
