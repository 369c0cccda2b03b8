"""KV cache groups on the Memory tab (issue 45): a model with sliding-window layers (Gemma 3,
windowed Mistral / Qwen) keeps its layers' KV in groups, one per layer kind, in the one pool
(engine/kv/cache_spec.py); a local (sliding) group gives a chat's blocks back once every token in
them has left the window. This module turns the stats contract (v8: `num_groups`, `kv_groups`,
`full_attention_blocks`, `window_released_blocks`; per block its `group`; per sequence
`group_blocks`) into what the tab shows: the layer kinds with their blocks and what the windows
gave back, the per-layer-kind arithmetic sentence (engine/observe/kv_groups.py), which block of a
chat's table belongs to which group, and each block's kind for the grid's "colour by layer kind".

Words (one vocabulary): a *layer kind* is "global" (full attention: keeps every token) or "local"
(keeps the last W tokens), as Gemma's model card names them; a *group* is the engine's unit (a
kind may need several groups of equal size). Blocks keep their state names (pinned, shared,
private, cached, free); a kind is what a block holds, not a state. Plain functions (no Gradio).
"""

from __future__ import annotations

from html import escape

from engine.observe.kv_groups import kv_arithmetic
from ui.dashboard.kv_math import DTYPE_BYTES, ModelShape, blocks_for, fmt_bytes

# the reference the issue names (google/gemma-3-1b-it: 26 layers, every sixth global, local layers
# over 512 tokens, 1 KV head of 256, bf16): the headline case of sliding-window KV
GEMMA3_1B = ModelShape(
    "Gemma-3-1B",
    26,
    4,
    1,
    256,
    "bfloat16",
    32768,
    layer_windows=tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(26)),
)


def has_groups(stats: dict) -> bool:
    """More than one group, or a sliding one (a model whose every layer is windowed)."""
    return stats.get("num_groups", 1) > 1 or any(
        g.get("sliding_window") for g in stats.get("kv_groups") or []
    )


def kind_name(window) -> str:
    return "global (all tokens)" if not window else f"local (last {window:,} tokens)"


def kinds(stats: dict) -> list[dict]:
    """The layer kinds of the stats' groups, global first: name, window, groups, layers, blocks
    in use, table entries released now and blocks given back so far."""
    out: dict = {}
    for g in stats.get("kv_groups") or []:
        w = g.get("sliding_window") or None
        k = out.setdefault(
            w,
            {
                "window": w,
                "name": kind_name(w),
                "groups": [],
                "layers": 0,
                "blocks": 0,
                "released_now": 0,
                "given_back": 0,
            },
        )
        k["groups"].append(g["group"])
        k["layers"] += len(g.get("layers") or [])
        k["blocks"] += g.get("used_blocks", 0)
        k["released_now"] += g.get("released_entries", 0)
        k["given_back"] += g.get("window_released_blocks", 0)
    return sorted(out.values(), key=lambda k: (k["window"] is not None, -(k["window"] or 0)))


def group_names(stats: dict) -> list[str]:
    """Per group index: its layer kind's name (empty for one group: nothing to tell apart)."""
    groups = stats.get("kv_groups") or []
    if not has_groups(stats):
        return []
    return [kind_name(g.get("sliding_window")) for g in sorted(groups, key=lambda g: g["group"])]


def kind_of_group(stats: dict) -> list[int]:
    """Per group index: the index of its layer kind in kinds(stats)."""
    ks = kinds(stats)
    at = {g: i for i, k in enumerate(ks) for g in k["groups"]}
    return [at[g] for g in sorted(at)]


def contiguous_blocks(stats: dict) -> int:
    """Blocks contiguous caches would reserve for the live chats: max_model_len for every layer of
    each (in the pool's blocks of P layer slots: layers / P blocks per position range; as the
    engine counts it, engine/observe/kv_snapshot.kv_stats)."""
    chats = stats["num_sequences"] + stats["num_idle_sessions"]
    per_chat = blocks_for(stats.get("max_model_len") or 0, stats["block_size"])
    groups = stats.get("kv_groups") or []
    layers = sum(len(g.get("layers") or []) for g in groups)
    slots = max((len(g.get("layers") or []) for g in groups), default=0)
    if not layers or not slots:
        return chats * per_chat
    return -(-chats * per_chat * layers // slots)


def arithmetic(shape: ModelShape, context_tokens: int) -> dict | None:
    """The per-layer-kind sentence for a chat of `context_tokens` on `shape` (None: windows
    unknown)."""
    if not shape.layer_windows:
        return None
    per_elem = DTYPE_BYTES.get(shape.dtype, 2) + shape.scale_bytes / shape.head_dim
    return kv_arithmetic(
        shape.layer_windows,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        dtype_bytes=per_elem,
        context_tokens=context_tokens,
        max_model_len=shape.max_len,
        name=shape.name,
    )


def table_groups(seq_or_conv: dict, block_size: int) -> list[dict]:
    """A chat's block table split by group: [{group, first_logical, count}] in table order. The
    snapshot lists every group's live blocks, group 0 first; a local group's live blocks are the
    last ones of the chat (the earlier ones were given back), a global group's all of them."""
    per = list(
        seq_or_conv.get("group_blocks")
        or [len(seq_or_conv.get("block_table") or seq_or_conv.get("table") or [])]
    )
    logical = max(per + [blocks_for(seq_or_conv.get("num_tokens") or 0, block_size)])
    return [{"group": g, "first_logical": logical - n, "count": n} for g, n in enumerate(per)]


def blocks_in_span(split: list[dict], first_block: int, last_block: int) -> int:
    """How many live blocks of a chat's table (table_groups) hold logical blocks first..last: one
    per group that still holds each of them (a local group may have given some back)."""
    return sum(
        max(
            0,
            min(last_block, g["first_logical"] + g["count"] - 1)
            - max(first_block, g["first_logical"])
            + 1,
        )
        for g in split
    )


def small_sentence(a: dict) -> str:
    """kv_groups' sentence with its sizes in the unit that fits (a tiny model's KV is KiB, and
    "0.0 MiB instead of 0.0 MiB" says nothing)."""
    if a["bytes"] >= 10 * 2**20 or a["saving_vs_full_attention"] < 1.05:
        return a["sentence"]
    head = a["sentence"].rsplit(": ", 1)[0]
    return (
        f"{head}: {fmt_bytes(a['bytes'])} instead of {fmt_bytes(a['full_attention_bytes'])}, "
        f"{a['saving_vs_full_attention']:.1f}x less"
    )


def _n(key: str, value, text: str) -> str:
    return f'<b data-k="{key}" data-v="{value}">{text}</b>'


def _kind_row(i: int, k: dict, bpb: int) -> str:
    swatch = f'<b class="kind-sw" style="background:var(--kv-kind-{i % 4})"></b>'
    blocks = f"{k['blocks']:,} ({fmt_bytes(k['blocks'] * bpb)})"
    return (
        f"<tr><td>{swatch}{escape(k['name'])}</td><td>{k['layers']}</td><td>{len(k['groups'])}</td>"
        f'<td data-k="kind_blocks_{i}" data-v="{k["blocks"]}">{blocks}</td>'
        f"<td>{k['released_now']:,}</td>"
        f'<td data-k="kind_given_back_{i}" data-v="{k["given_back"]}">{k["given_back"]:,}</td></tr>'
    )


def _saving_line(stats: dict) -> str:
    used = stats.get("chat_used_blocks", stats["used_blocks"])
    full, contig = stats.get("full_attention_blocks", 0), contiguous_blocks(stats)
    if not full:
        return ""
    saved = stats.get("savings_vs_full_attention", 0.0)
    released = stats.get("window_released_blocks", 0)
    return (
        f"<p>The live chats hold <b>{used:,}</b> blocks; full-attention paging (every layer "
        f"keeps every token) would hold {_n('full_attention_blocks', full, f'{full:,}')}: "
        f"{_n('savings_vs_full_attention', f'{saved:.4f}', f'{100 * saved:.0f}%')} less; "
        f"contiguous caches (max length reserved for every layer of every chat) would reserve "
        f"{_n('contiguous_blocks', contig, f'{contig:,}')}. The windows gave back "
        f"{_n('window_released_blocks', released, f'{released:,}')} blocks so far.</p>"
    )


HEAD = (
    '<h4>KV cache groups: layers by kind, in one pool</h4><div class="muted">Global layers '
    "keep every token of a chat; local (sliding-window) layers keep only the last W, so their "
    "older blocks go back to the pool as a chat grows.</div>"
)
TABLE_HEAD = (
    "<tr><th>layer kind</th><th>layers</th><th>groups</th><th>blocks in use</th>"
    '<th title="Table entries of the live chats whose tokens left the window (their blocks were '
    'given back)">left the window now</th>'
    '<th title="Blocks given back by the windows since start">given back so far</th></tr>'
)


def groups_html(stats: dict, shape: ModelShape | None, longest_chat: int | None = None) -> str:
    """The "KV cache groups" section under the tiles: a row per layer kind, what the windows saved
    against full-attention paging and contiguous caches, and the arithmetic sentences (the live
    model at its longest live chat, or its context; Gemma-3-1B at 8,192 tokens for scale)."""
    if not has_groups(stats):
        return ""
    rows = "".join(_kind_row(i, k, stats["kv_bytes_per_block"]) for i, k in enumerate(kinds(stats)))
    sentences = []
    live = arithmetic(shape, longest_chat or shape.max_len) if shape is not None else None
    if live is not None:
        contig = fmt_bytes(live["contiguous_bytes"])
        sentences.append(
            f'<li data-k="arith_live">{escape(small_sentence(live))} (contiguous: {contig}).</li>'
        )
    ref = arithmetic(GEMMA3_1B, 8192)
    sentences.append(f'<li data-k="arith_ref">{escape(ref["sentence"])}.</li>')
    return (
        f'<div class="kvd kvgroups">{HEAD}<div class="scroll"><table>{TABLE_HEAD}{rows}</table>'
        f'</div>{_saving_line(stats)}<ul class="kvarith">{"".join(sentences)}</ul></div>'
    )


GROUPS_CSS = """
.kvgroups .kind-sw { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
  margin-right: 4px; vertical-align: -1px; }
.kvgroups p { margin: 4px 0; } .kvgroups ul.kvarith { margin: 4px 0 0 18px; padding: 0; }
.kvt .gname { font: 11px sans-serif; opacity: .8; margin: 2px 4px 0 0; width: 100%; }
"""
