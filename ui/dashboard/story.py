"""The Memory tab's headline: one plain sentence with the pool for scale, and three bars drawn to
one scale (paged + shared, paged without sharing, contiguous reservation; the pool marked).

Why: a newcomer must get the point in ten seconds. Tiles of equal weight and ratios such as
"98% vs contiguous max-len" did not land; "they would need 2.8x this whole pool" does.
Every number comes from the snapshot's stats contract (engine/observe/kv_contract.KVStats), nothing is
re-derived from the grid, so the headline equals /api/kv for the same tick (data-k / data-v
attributes carry the raw values for the browser test).
"""

from __future__ import annotations

from html import escape

from ui.dashboard.groups_view import contiguous_blocks, has_groups
from ui.dashboard.kv_math import blocks_for, fmt_bytes


def story_numbers(st: dict) -> dict:
    """The headline's numbers, from one snapshot's stats."""
    bs, total = st["block_size"], st["total_blocks"]
    chats = st["num_sequences"] + st["num_idle_sessions"]
    per_chat = blocks_for(st["max_model_len"], bs) if st.get("max_model_len") else 0
    contiguous = contiguous_blocks(st)  # every layer of every chat (groups: layers / P blocks)
    one = contiguous_blocks({**st, "num_sequences": 1, "num_idle_sessions": 0})  # one chat's
    unshared = st["logical_blocks"]
    used = st.get(
        "chat_used_blocks", st["used_blocks"]
    )  # blocks the chats hold (pins no chat uses excluded)
    return {
        "chats": chats,
        "used_blocks": used,
        "unshared_blocks": unshared,
        "contiguous_blocks": contiguous,
        "total_blocks": total,
        "pinned_blocks": st.get("pinned_blocks", 0),
        "saved_blocks": st.get("saved_blocks", max(0, unshared - used)),
        "saved_frac": st["savings_vs_unshared"],
        "per_chat_blocks": per_chat,
        "contiguous_x_pool": contiguous / total if total else 0.0,
        "contiguous_fit": total // one if one else 0,
        "bpb": st["kv_bytes_per_block"],
        "max_model_len": st.get("max_model_len", 0),
        "block_size": bs,
        "kv_dtype": st.get("kv_cache_dtype", ""),
        "bpt": st.get("kv_bytes_per_token", 0),
        # KV cache groups (sliding windows): what full-attention paging holds, what was given back
        "groups": has_groups(st),
        "full_blocks": st.get("full_attention_blocks", 0),
        "num_groups": st.get("num_groups", 1),
        "released": st.get("window_released_blocks", 0),
    }


def _n(key: str, value, text: str) -> str:
    return f'<b data-k="{key}" data-v="{escape(str(value), quote=True)}">{escape(text)}</b>'


def story_sentence(n: dict) -> str:
    """HTML of the one sentence (numbers wrapped with their raw values)."""
    bpb = n["bpb"]
    pool = (
        f'The pool holds {_n("total_blocks", n["total_blocks"], format(n["total_blocks"], ","))} '
        f'blocks of {n["block_size"]} tokens ({fmt_bytes(n["total_blocks"] * bpb)})'
    )
    pinned = (
        f', {_n("pinned_blocks", n["pinned_blocks"], format(n["pinned_blocks"], ","))} of them '
        f'pinned for the shared system prompt'
        if n["pinned_blocks"]
        else ""
    )
    if not n["chats"]:
        return f"{pool}{pinned}. No chats are open yet: start the demo users or open a chat."
    chats = "1 chat holds" if n["chats"] == 1 else f'{n["chats"]:,} chats hold'
    s = (
        f'{_n("chats", n["chats"], chats)} {_n("chat_used_blocks", n["used_blocks"], format(n["used_blocks"], ","))} '
        f'blocks ({fmt_bytes(n["used_blocks"] * bpb)}). Without sharing they would need '
        f'{_n("unshared_blocks", n["unshared_blocks"], format(n["unshared_blocks"], ","))} blocks, so sharing saves '
        + _n("saved_frac", n["saved_frac"], f"{100 * n['saved_frac']:.0f}%")
    )
    if n["groups"] and n["full_blocks"] > n["unshared_blocks"]:
        released = _n("window_released_blocks", n["released"], format(n["released"], ","))
        s += (
            f'; sliding windows gave back {released} '
            f'blocks: with every layer keeping every token they would need '
            f'{_n("full_attention_blocks", n["full_blocks"], format(n["full_blocks"], ","))}'
        )
    if n["per_chat_blocks"]:
        fit = n["contiguous_fit"]
        s += (
            f'; reserving {n["max_model_len"]:,} tokens each, as contiguous caches do, they would need '
            f'{_n("contiguous_blocks", n["contiguous_blocks"], format(n["contiguous_blocks"], ","))} blocks '
            f'({fmt_bytes(n["contiguous_blocks"] * bpb)}), '
            + _n(
                "contiguous_x_pool",
                round(n["contiguous_x_pool"], 3),
                f"{n['contiguous_x_pool']:.1f}x",
            )
            + f' this whole pool, so only {fit:,} chat{"s" if fit != 1 else ""} would fit'
        )
    return f"{s}. {pool}{pinned}."


def bars_html(n: dict) -> str:
    """Three bars to one scale; a dashed line marks the pool size."""
    rows = [
        ("paged + shared (this engine)", n["used_blocks"], "kvb-u"),
        ("paged without sharing", n["unshared_blocks"], "kvb-p"),
        ("contiguous, max length reserved", n["contiguous_blocks"], "kvb-c"),
    ]
    if n.get("groups") and n["full_blocks"] > n["unshared_blocks"]:  # windows: one more step
        rows.insert(2, ("... and without sliding windows", n["full_blocks"], "kvb-w"))
    scale = max([n["total_blocks"]] + [v for _, v, _ in rows]) or 1
    pool_at = 100 * n["total_blocks"] / scale
    out = []
    for label, v, cls in rows:
        w = 100 * v / scale
        out.append(
            f'<div class="kvb-row"><span class="kvb-l">{escape(label)}</span><span class="kvb-t">'
            f'<span class="kvb-bar {cls}" style="width:{w:.2f}%"></span>'
            f'<span class="kvb-pool" style="left:{pool_at:.2f}%"></span></span>'
            f'<span class="kvb-v">{v:,} blocks</span></div>'
        )
    return (
        f'<div class="kvb">{"".join(out)}<div class="muted">dashed line: the whole pool '
        f'({n["total_blocks"]:,} blocks)</div></div>'
    )


def pin_use(snap: dict) -> dict:
    """The pinned prompt in the first line: its tokens, how many chats' tables start with it, and
    its blocks no table holds (the gap between "blocks used" and what the chats hold)."""
    pins = snap.get("pins") or []
    if not pins:
        return {"tokens": 0, "chats": 0, "pin_only": 0}
    pin = max(pins, key=lambda p: len(p["block_table"]))
    first = pin["block_table"][0] if pin["block_table"] else None
    chats = sum(1 for s in snap.get("sequences") or [] if s["block_table"][:1] == [first])
    held = {b for s in snap.get("sequences") or [] for b in s["block_table"]}
    pin_only = sum(1 for p in pins for b in p["block_table"] if b not in held)
    return {
        "tokens": pin["num_tokens"],
        "chats": chats,
        "pin_only": pin_only,
        "blocks": len(pin["block_table"]),
    }


def first_line(n: dict, pin: dict | None) -> str:
    """The headline's short, concrete first line (issue 26.8), e.g. "One 544-token system prompt
    stored once for 4 chats: sharing saves 102 blocks (36 MiB)". With one chat on the pinned
    prompt nothing is saved yet, so it says what the pin will save (issue 47): "every new chat
    shares its 34 blocks (24 MiB) instead of storing them again"."""
    bpb = n["bpb"]
    saved = (
        f'sharing saves {_n("saved_blocks", n["saved_blocks"], format(n["saved_blocks"], ","))} blocks '
        f'({fmt_bytes(n["saved_blocks"] * bpb)})'
    )
    if pin and pin["chats"] == 1 and pin.get("blocks"):
        return (
            f'One chat uses the pinned {_n("pin_tokens", pin["tokens"], format(pin["tokens"], ","))}-token '
            f'system prompt: every new chat will share its '
            f'{_n("pin_blocks", pin["blocks"], format(pin["blocks"], ","))} blocks '
            f'({fmt_bytes(pin["blocks"] * bpb)}) instead of storing them again.'
        )
    if pin and pin["chats"]:
        chats = "1 chat" if pin["chats"] == 1 else f'{pin["chats"]:,} chats'
        return (
            f'One {_n("pin_tokens", pin["tokens"], format(pin["tokens"], ","))}-token system prompt stored '
            f'once for {_n("pin_chats", pin["chats"], chats)}: {saved}.'
        )
    if n["chats"] == 1:
        return (
            "One chat holds blocks: sharing starts with a second chat that begins the same way "
            "(the same system prompt or document)."
        )
    if n["chats"]:
        return f'{n["chats"]:,} chats open: {saved}.'
    return "No chats hold blocks now."


def kv_format_line(n: dict, model: str = "") -> str:
    """The KV cache's format, up front (issue 47: `--kv-cache-dtype int8` was visible only in a
    closed accordion): dtype, bytes per token and per block; with `model`, whose cache it is (an
    app with several models switches between pools)."""
    if not n["bpt"]:
        return ""
    whose = f" of {_n('model', model, model)}" if model else ""
    return (
        f'<div class="muted kvs-fmt" title="Bytes of K and V the pool stores for each token (2 x layers x '
        f'KV heads x head size x dtype bytes); open KV arithmetic below for the formula.">'
        f'KV cache{whose}: '
        f'{_n("kv_cache_dtype", n["kv_dtype"], n["kv_dtype"] or "unknown dtype")} · '
        f'{_n("kv_bytes_per_token", n["bpt"], format(n["bpt"], ","))} B per token'
        + (f' in each of its {n["num_groups"]} KV cache groups' if n["num_groups"] > 1 else "")
        + ' · '
        f'{fmt_bytes(n["bpb"])} per {n["block_size"]}-token block</div>'
    )


def used_line(st: dict, pin: dict | None) -> str:
    """Blocks used = what the chats hold + the pinned prompt's blocks no chat holds: the same
    count as the "Blocks used" tile, explained."""
    if not pin or not pin["pin_only"]:
        return ""
    return (
        f'<div class="muted">Blocks used {st["used_blocks"]:,} = '
        f'{_n("chat_held_blocks", st["used_blocks"] - pin["pin_only"], format(st["used_blocks"] - pin["pin_only"], ","))}'
        f' held by chats + {_n("pin_only_blocks", pin["pin_only"], format(pin["pin_only"], ","))} of the pinned '
        f'prompt that no chat holds now.</div>'
    )


def story_html(
    st: dict,
    others: dict | None = None,
    pin: dict | None = None,
    open_line: str = "",
    model: str = "",
) -> str:
    """others (under --auth): {"chats", "blocks"} of everyone else, shown only as counts.
    pin: pin_use(snap) for the first line; open_line: ui/dashboard/open_chats.line_html; model:
    the served model's name (the KV format line says whose cache it is)."""
    n = story_numbers(st)
    extra = open_line
    if others and others.get("chats"):
        extra += (
            f'<div class="muted" data-k="others_chats" data-v="{others["chats"]}">{others["chats"]:,} '
            f'other chat{"s" if others["chats"] != 1 else ""} (other users, demo users, API calls) '
            f'hold {others["blocks"]:,} blocks; they are counted above but not named.</div>'
        )
    return (
        f'<div class="kvd kvs"><p class="kvs-1">{first_line(n, pin)}</p>'
        f'<p class="kvs-s">{story_sentence(n)}</p>{kv_format_line(n, model)}'
        f'{used_line(st, pin)}{bars_html(n)}'
        f'{extra}</div>'
    )


STORY_CSS = """
.kvs .kvs-1 { font-size: 18px; font-weight: 650; line-height: 1.35; margin: 2px 0 4px; }
.kvs .kvs-s { font-size: 13px; line-height: 1.45; margin: 0 0 8px; opacity: .85; }
.kvb-row { display: grid; grid-template-columns: 230px 1fr 110px; gap: 8px; align-items: center; margin: 3px 0; }
.kvb-t { position: relative; height: 16px; background: var(--kv-track, #f3f4f6); border-radius: 3px; }
.kvb-bar { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 3px; }
.kvb-u { background: var(--kv-bar-used, #0f766e); } .kvb-p { background: var(--kv-bar-unshared, #94a3b8); }
.kvb-c { background: var(--kv-bar-contig, #d4d4d8); }
.kvb-w { background: var(--kv-bar-nowindow, #cbd5e1); }
.kvb-pool { position: absolute; top: -3px; bottom: -3px; border-left: 2px dashed var(--body-text-color, #111); }
.kvb-v { font-variant-numeric: tabular-nums; text-align: right; }
"""
