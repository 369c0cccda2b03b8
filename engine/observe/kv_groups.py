"""What KV cache groups buy, in words and numbers: pure functions for the Memory tab, /api/kv
readers, the bench and the docs.

Why here: the sentence ("Gemma-3-1B, an 8,192-token chat: 4 global layers keep all 8,192 tokens,
22 local layers keep the last 512: 43 MiB instead of 208 MiB, 4.8x less") is arithmetic on the
model's per-layer windows and KV shape, the same for the UI, the routes and the bench; and the
per-group rows come from the stats contract (engine/observe/kv_contract.py, v8 `kv_groups`).
Nothing here reads the engine: callers pass numbers (e.g. `ModelInfo.layer_windows`) or the
stats JSON.

Words: a full-attention layer is "global" (it keeps every token of the chat), a sliding-window
layer "local" (it keeps the last W tokens), as Gemma's model card names them.
"""

from __future__ import annotations

MIB = 2**20


def _mib(n: float) -> str:
    v = n / MIB
    return f"{v:,.0f} MiB" if v >= 10 else f"{v:,.1f} MiB"


def kv_arithmetic(
    layer_windows,
    *,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: float,
    context_tokens: int,
    max_model_len: int | None = None,
    name: str = "",
) -> dict:
    """KV bytes of one chat of `context_tokens` tokens, per layer kind (`layer_windows`: one window
    per layer, None or 0 for a global one, as `ModelInfo.layer_windows`): with groups (a local layer
    keeps min(context, W) tokens), with full-attention paging (every layer keeps every token) and
    with contiguous caches (every layer reserves max_model_len). `dtype_bytes` per element (an
    int8 row's scale spread over it is fine). Returns the numbers and the sentence."""
    per_token_layer = 2 * kv_heads * head_dim * dtype_bytes
    kinds: dict = {}
    for w in (w or None for w in layer_windows):  # 0 or None: full attention (global)
        kinds[w] = kinds.get(w, 0) + 1
    rows = []
    for w in sorted(kinds, key=lambda w: (w is not None, -(w or 0))):
        kept = context_tokens if w is None else min(context_tokens, w)
        rows.append(
            {
                "kind": "global" if w is None else "local",
                "window": w,
                "layers": kinds[w],
                "tokens_kept": kept,
                "bytes": kinds[w] * kept * per_token_layer,
            }
        )
    n_layers = sum(kinds.values())
    grouped = sum(r["bytes"] for r in rows)
    full = n_layers * context_tokens * per_token_layer
    contiguous = n_layers * (max_model_len or context_tokens) * per_token_layer
    out = {
        "name": name,
        "context_tokens": context_tokens,
        "kinds": rows,
        "bytes": grouped,
        "full_attention_bytes": full,
        "contiguous_bytes": contiguous,
        "saving_vs_full_attention": full / grouped if grouped else 1.0,
        "saving_vs_contiguous": contiguous / grouped if grouped else 1.0,
    }
    out["sentence"] = sentence(out)
    return out


def _kind_phrase(r: dict) -> str:
    layers = f"{r['layers']} {r['kind']} layer{'s' if r['layers'] != 1 else ''}"
    keep = "keeps" if r["layers"] == 1 else "keep"
    if r["window"] is None or r["tokens_kept"] < r["window"]:
        return f"{layers} {keep} all {r['tokens_kept']:,} tokens"
    return f"{layers} {keep} the last {r['window']:,}"


def sentence(a: dict) -> str:
    """One line: who keeps what, and the bytes against full-attention paging."""
    lead = f"{a['context_tokens']:,}".split(",")[0]
    article = (
        "an" if lead.startswith("8") or lead in ("11", "18") else "a"
    )  # "an eight...", "an eleven..."
    head = f"{a['name']}, {article}" if a["name"] else article.capitalize()
    parts = ", ".join(_kind_phrase(r) for r in a["kinds"])
    ratio = a["saving_vs_full_attention"]
    if ratio < 1.05:
        tail = (
            f"{_mib(a['bytes'])} (the chat fits in every window: nothing to give back yet)"
            if any(r["window"] for r in a["kinds"])
            else _mib(a["bytes"])
        )
    else:
        tail = f"{_mib(a['bytes'])} instead of {_mib(a['full_attention_bytes'])}, {ratio:.1f}x less"
    return f"{head} {a['context_tokens']:,}-token chat: {parts}: {tail}"


def group_rows(stats: dict) -> list[dict]:
    """The KV cache groups of a stats JSON (v8) as table rows for a view: what each group is,
    its blocks in use and what its window gave back (an older producer: one full group)."""
    groups = stats.get("kv_groups") or [
        {
            "group": 0,
            "kind": "full",
            "sliding_window": None,
            "layers": [],
            "used_blocks": stats.get("used_blocks", 0),
            "held_blocks": 0,
            "released_entries": 0,
            "window_released_blocks": 0,
        }
    ]
    rows = []
    for g in groups:
        w = g.get("sliding_window")
        rows.append(
            {
                "group": g["group"],
                "kind": "global (all tokens)" if w is None else f"local (last {w:,})",
                "layers": len(g.get("layers") or []),
                "blocks_in_use": g["used_blocks"],
                "given_back_now": g.get("released_entries", 0),
                "given_back_total": g.get("window_released_blocks", 0),
            }
        )
    return rows


def window_line(stats: dict) -> str:
    """A plain line for the Memory tab: how much of the live chats' KV the windows gave back."""
    if stats.get("num_groups", 1) <= 1 and not stats.get("window_released_blocks"):
        return ""
    held, full = (
        stats.get("chat_used_blocks", stats.get("used_blocks", 0)),
        stats.get("full_attention_blocks", 0),
    )
    if not full:
        return f"sliding windows gave back {stats.get('window_released_blocks', 0):,} blocks so far"
    return (
        f"the live chats hold {held:,} blocks; without sliding windows they would hold {full:,} "
        f"({stats.get('savings_vs_full_attention', 0.0):.0%} saved); "
        f"{stats.get('window_released_blocks', 0):,} blocks given back so far"
    )
