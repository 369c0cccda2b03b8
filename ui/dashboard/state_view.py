"""Memory that is not KV on the Memory tab (issue 51): linear-attention states and experts.

Why a section of its own: for Qwen3.5 (three of every four layers Gated DeltaNet) the block grid
shows only a quarter of the story. A linear-attention layer keeps no KV: it keeps one fixed-size
*state* per chat (its running summary of every token read so far), the same size at token 10 and
at token 30,000, in a state pool beside the block pool (engine/kv/state_groups.py). A slot is held
like a block: by a running chat, by a chat between turns, or by a *checkpoint* (a state saved at
a block boundary of a cached prefix, so a prefix hit restores the state with the KV). This module
turns the stats contract v9 (`state_groups`, the snapshot's `state_slots`) and the model's
`ModelInfo` (layer_mixers, state_bytes_per_slot, weights_bytes, weights_read_per_token_bytes,
experts) into that section: slots in use with their bytes and holders, the checkpoints and what
they served, the per-layer-kind arithmetic of the live model (engine/observe/state_memory.py) and
one fixed comparison computed from the shipped configs; for a mixture of experts, the weights one
token reads. Plain functions (no Gradio); every text through html.escape.

Words (ui/dashboard/vocabulary.py, panels.STATE_WORDS): a chat is "running" or "between turns";
"state" only ever means the linear-attention memory, "slot" the pool's unit holding one chat's
state over all its linear layers. Under --auth the snapshot holds only the viewer's own chats
(engine/observe/viewer_scope.py); a slot held by anyone else is "another chat", never its id.
"""

from __future__ import annotations

from functools import lru_cache
from html import escape

from engine.observe.kv_groups import _mib, kv_arithmetic
from engine.observe.state_memory import crossover_tokens, moe_arithmetic, state_arithmetic
from ui.dashboard.kv_math import ModelShape, fmt_bytes
from ui.dashboard.view import conversation_key

REFERENCE = ("qwen3.5-0.8b", "qwen3-0.6b")  # shipped configs (engine/exec/configs/)
REFERENCE_TOKENS = 32768
REFERENCE_DTYPE_BYTES = 2  # bf16 KV and conv tails (as on a GPU); the recurrent state is fp32
MAX_SLOT_ROWS = 12
CHECKPOINT = "checkpoint"  # the holder name the snapshot gives a checkpoint (StateSlotView)


def has_state(stats: dict) -> bool:
    """A model with linear-attention layers (stats v9 carry its state pool; {} otherwise)."""
    return bool(stats.get("state_groups"))


def is_moe(info) -> bool:
    return bool(getattr(info, "experts", ()) or ())


def holders(snap: dict) -> dict:
    """Who holds the snapshot's state slots: per kind (running chats, chats between turns,
    checkpoints, other chats: not in this viewer's scope) the number of holders, and one row per
    held slot with its holders' names as this viewer sees them (titles; "another chat")."""
    names, kind = {}, {}
    for s in snap.get("sequences") or []:
        running = s.get("state") == "running"
        who = s.get("seq_id") if running else s.get("session_id")
        if who is None:
            continue
        names[str(who)] = s.get("title") or conversation_key(s)
        kind[str(who)] = "running" if running else "between_turns"
    counts = {"running": 0, "between_turns": 0, "checkpoints": 0, "other": 0}
    rows = []
    for v in snap.get("state_slots") or []:
        shown = []
        for h in v.get("holders") or []:
            if h == CHECKPOINT:
                counts["checkpoints"] += 1
                shown.append(CHECKPOINT)
            elif str(h) in kind:
                counts[kind[str(h)]] += 1
                shown.append(names[str(h)])
            else:
                counts["other"] += 1
                shown.append("another chat")
        rows.append(
            {
                "slot": v["slot"],
                "holders": shown,
                "tokens": v.get("tokens", -1),
                "bytes": v.get("bytes", 0),
                "checkpoint_uses": v.get("checkpoint_uses", 0),
                "is_checkpoint": shown == [CHECKPOINT],
            }
        )
    counts["checkpoint_uses"] = sum(r["checkpoint_uses"] for r in rows if r["is_checkpoint"])
    return {"counts": counts, "rows": rows}


def layer_counts(info) -> tuple[int, int]:
    """(attention layers, linear-attention layers) of the live model."""
    mixers = tuple(getattr(info, "layer_mixers", ()) or ())
    return mixers.count("attention"), mixers.count("linear")


def live_arithmetic(info, shape: ModelShape | None, context_tokens: int) -> dict | None:
    """state_memory's per-layer-kind numbers for the live model at `context_tokens` (None: no
    linear layers or no shape). KV of one token in one attention layer is the pool's formula
    (kv_math.ModelShape: quantized rows carry their scale); the state per layer is the slot's
    bytes over the linear layers (one slot holds them all)."""
    att, lin = layer_counts(info)
    slot = int(getattr(info, "state_bytes_per_slot", 0) or 0)
    if not lin or not slot or shape is None or not shape.layers:
        return None
    kv_layer = shape.bytes_per_token / shape.layers
    per_layer = slot // lin
    out = state_arithmetic(
        attention_layers=att,
        linear_layers=lin,
        kv_bytes_per_token_layer=kv_layer,
        state_bytes_per_layer=per_layer,
        context_tokens=context_tokens,
        name=shape.name,
        fmt=fmt_bytes,
    )
    out["crossover_tokens"] = crossover_tokens(
        attention_layers=att,
        linear_layers=lin,
        kv_bytes_per_token_layer=kv_layer,
        state_bytes_per_layer=per_layer,
    )
    return out


@lru_cache(maxsize=1)
def reference(context_tokens: int = REFERENCE_TOKENS) -> dict:
    """Qwen3.5-0.8B beside Qwen3-0.6B (about the same size, attention in all 28 layers) for one
    chat of `context_tokens`, computed once from the shipped configs as the engine reads them."""
    from engine.exec.dummy_weights import load_config  # a transformers config: only when shown
    from engine.exec.models.decoder_spec import describe

    q35, q3 = (load_config(n) for n in REFERENCE)
    spec = describe(q35)
    b = REFERENCE_DTYPE_BYTES
    hybrid = state_arithmetic(
        attention_layers=len(spec.kv_layers),
        linear_layers=len(spec.linear_layers),
        kv_bytes_per_token_layer=2 * q35.num_key_value_heads * q35.head_dim * b,
        state_bytes_per_layer=spec.linear.state_bytes(b),
        context_tokens=context_tokens,
        name="Qwen3.5-0.8B",
    )
    peer = kv_arithmetic(
        [0] * q3.num_hidden_layers,
        kv_heads=q3.num_key_value_heads,
        head_dim=q3.head_dim,
        dtype_bytes=b,
        context_tokens=context_tokens,
        name="Qwen3-0.6B",
    )
    ratio = peer["bytes"] / hybrid["bytes"]
    sentence = (
        f"{hybrid['sentence']}. Qwen3-0.6B, about the same size with attention in all "
        f"{q3.num_hidden_layers} layers, holds {_mib(peer['bytes'])} for the same chat: "
        f"{ratio:.1f}x more (bf16 KV)"
    )
    return {"hybrid": hybrid, "peer": peer, "ratio": ratio, "sentence": sentence}


def moe_line(info, name: str = "") -> dict | None:
    """The weights one decoded token reads (k of E experts per layer) of all the weights held."""
    if not is_moe(info) or not getattr(info, "weights_bytes", 0):
        return None
    experts, top_k = info.experts
    return moe_arithmetic(
        weights_bytes=info.weights_bytes,
        weights_read_per_token_bytes=info.weights_read_per_token_bytes,
        num_experts=experts,
        top_k=top_k,
        name=name,
        fmt=fmt_bytes,
    )


def _n(key: str, value, text: str) -> str:
    return f'<b data-k="{key}" data-v="{value}">{escape(text)}</b>'


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _slot_rows(rows: list[dict]) -> str:
    if not rows:
        return '<div class="muted">No state slot is held now.</div>'
    out = [
        '<div class="scroll"><table><tr><th>slot</th><th class="l">held by</th>'
        '<th title="Tokens the state has read (a checkpoint: the prefix it ends)">tokens read</th>'
        '<th>bytes</th><th title="Prefix hits this checkpoint served">hits served</th></tr>'
    ]
    for r in rows[:MAX_SLOT_ROWS]:
        toks = f"{r['tokens']:,}" if r["tokens"] >= 0 else "–"
        uses = f"{r['checkpoint_uses']:,}" if r["is_checkpoint"] else "–"
        out.append(
            f'<tr data-k="state_slot_{r["slot"]}"><td>{r["slot"]}</td>'
            f"<td class=\"l\">{escape(', '.join(r['holders']))}</td><td>{toks}</td>"
            f"<td>{fmt_bytes(r['bytes'])}</td><td>{uses}</td></tr>"
        )
    out.append("</table></div>")
    if len(rows) > MAX_SLOT_ROWS:
        out.append(f'<div class="muted">… and {len(rows) - MAX_SLOT_ROWS} more</div>')
    return "".join(out)


def _forks(sg: dict) -> str:
    """Slots shared by forks (n > 1, beam search), each copied before its first write; "" when
    no fork ever shared one."""
    shared, copies = sg.get("state_slots_shared", 0), sg.get("state_cow_copies", 0)
    if not shared and not copies:
        return ""
    return (
        f"{_plural(shared, 'slot is', 'slots are')} shared by forks now (a fork copies the "
        f"state before its first write: {_plural(copies, 'copy', 'copies')} so far)."
    )


STATE_HEAD = "<h4>Linear-attention states: a fixed memory per chat, beside the blocks</h4>"


def _state_part(snap: dict, info, shape, longest_chat) -> str:
    sg = snap["stats"]["state_groups"]
    per, total, used = sg["state_bytes_per_slot"], sg["state_slots_total"], sg["state_slots_used"]
    att, lin = layer_counts(info)
    h = holders(snap)
    c = h["counts"]
    layers = (
        f"{lin} of this model's {att + lin} layers are" if lin else "Some layers of this model are"
    )
    intro = (
        f'<div class="muted">{layers} linear attention (Gated DeltaNet). Such a layer keeps no KV: '
        "it keeps one fixed-size <i>state</i> per chat, its running summary of every token read "
        "so far, the same size at token 10 and at token 30,000. One state slot holds a chat's "
        f"states in all those layers: {escape(fmt_bytes(per))}.</div>"
    )
    other = f", {_plural(c['other'], 'other chat')}" if c["other"] else ""
    slots = (
        f"<p>State slots in use: {_n('state_slots_used', used, f'{used:,}')} of "
        f"{_n('state_slots_total', total, f'{total:,}')} "
        f"({_n('state_bytes_used', used * per, fmt_bytes(used * per))} of "
        f"{escape(fmt_bytes(total * per))}; peak {sg.get('state_peak_used_slots', 0):,}), held by "
        f"{_n('state_running', c['running'], _plural(c['running'], 'running chat'))}, "
        f"{_n('state_between_turns', c['between_turns'], _plural(c['between_turns'], 'chat'))} "
        f"between turns{other} and "
        f"{_n('state_checkpoints', c['checkpoints'], _plural(c['checkpoints'], 'checkpoint'))}. "
        f"{_forks(sg)}</p>"
    )
    hits = sg.get("state_checkpoint_hits", 0)
    ck = (
        "<p>Checkpoints are states saved at block boundaries of cached prefixes (a pinned system "
        "prompt's end, a prompt's last full block), so a prefix hit restores the state with the "
        f"KV instead of reading the prefix again. The ones held now served "
        f"{_n('state_checkpoint_uses', c['checkpoint_uses'], _plural(c['checkpoint_uses'], 'hit'))}"
        f"; since start: {_n('state_checkpoint_hits', hits, _plural(hits, 'hit'))}, "
        f"{_plural(sg.get('state_checkpoints_taken', 0), 'checkpoint')} taken.</p>"
    )
    tier = ""
    if sg.get("state_tier_loads") or sg.get("state_tier_writes"):
        tier = (
            f'<p class="muted">KV tier: {_plural(sg.get("state_tier_writes", 0), "state")} '
            f'written, {_plural(sg.get("state_tier_loads", 0), "state")} read back.</p>'
        )
    sentences = []
    live = live_arithmetic(info, shape, longest_chat or getattr(shape, "max_len", 0) or 0)
    if live is not None:
        cross = live["crossover_tokens"]
        tail = (
            f" From {cross:,} tokens on, the fixed states cost less than the KV those layers "
            "would keep."
            if cross
            else ""
        )
        sentences.append(f'<li data-k="state_arith_live">{escape(live["sentence"])}.{tail}</li>')
    sentences.append(f'<li data-k="state_arith_ref">{escape(reference()["sentence"])}.</li>')
    return (
        f'<div class="kvd kvstate">{STATE_HEAD}{intro}{slots}{ck}{tier}'
        f'{_slot_rows(h["rows"])}<ul class="kvarith">{"".join(sentences)}</ul></div>'
    )


def _moe_part(info, name: str) -> str:
    m = moe_line(info, name)
    if m is None:
        return ""
    read, held = m["weights_read_per_token_bytes"], m["weights_bytes"]
    return (
        '<div class="kvd kvmoe"><h4>Mixture of experts: the weights one token reads</h4>'
        '<div class="muted">Each layer\'s MLP is split into experts; a router picks a few of '
        "them for each token, so a decoding step reads only those experts' weights (plus "
        "attention and the output layer), not all the weights held.</div>"
        f'<p data-k="moe_line" data-read="{read}" data-held="{held}">'
        f"Weights read per token: {escape(m['sentence'])}.</p></div>"
    )


def state_html(snap: dict, info, shape: ModelShape | None, longest_chat: int | None = None) -> str:
    """The "Linear-attention states" section (a model with state groups only) and the "Mixture of
    experts" line (an MoE model only); "" for every other model."""
    parts = []
    if has_state(snap["stats"]):
        parts.append(_state_part(snap, info, shape, longest_chat))
    if info is not None:
        parts.append(_moe_part(info, shape.name if shape is not None else ""))
    return "".join(parts)


def chat_state_note(stats: dict) -> str:
    """For a chat's block-table line: the state slot it holds beside its blocks ("" without)."""
    sg = stats.get("state_groups") or {}
    if not sg.get("state_bytes_per_slot"):
        return ""
    slot = fmt_bytes(sg["state_bytes_per_slot"])
    return f" + 1 state slot ({slot}) for its linear-attention layers"


STATE_CSS = """
.kvstate p, .kvmoe p { margin: 4px 0; } .kvstate th.l, .kvstate td.l { text-align: left; }
.kvstate ul.kvarith { margin: 4px 0 0 18px; padding: 0; }
"""
