"""What linear attention and experts change about memory, in words and numbers: pure functions for
the Memory tab, /api/kv readers, the bench and the docs.

Why here: "a Qwen3.5 chat costs a quarter of the KV of a Qwen3 one" is arithmetic on the layer
kinds and shapes of the model's config, the same for every reader. A full-attention layer keeps
K and V for every token of the chat (it grows with the chat); a linear-attention layer (Gated
DeltaNet) keeps one fixed state per chat whatever its length; a model "of the same size" with
attention in every layer keeps KV in all of them. For a mixture of experts, the weights one
token reads (its k experts, not all E) are what a decode step streams from memory. Callers pass
numbers (`ModelInfo` carries them); nothing here reads the engine.
"""

from __future__ import annotations

from engine.observe.kv_groups import _mib


def state_arithmetic(
    *,
    attention_layers: int,
    linear_layers: int,
    kv_bytes_per_token_layer: float,
    state_bytes_per_layer: int,
    context_tokens: int,
    name: str = "",
    fmt=_mib,
) -> dict:
    """Bytes one chat of `context_tokens` tokens holds, per layer kind, and against the same model
    with attention in every layer. kv_bytes_per_token_layer: K + V of one token in one attention
    layer; state_bytes_per_layer: one chat's recurrent state + conv tail in one linear layer.
    fmt: bytes -> words in the sentence (MiB; the Memory tab passes a unit that fits a tiny
    model)."""
    kv = attention_layers * context_tokens * kv_bytes_per_token_layer
    state = linear_layers * state_bytes_per_layer
    all_attention = (attention_layers + linear_layers) * context_tokens * kv_bytes_per_token_layer
    total = kv + state
    out = {
        "name": name,
        "context_tokens": context_tokens,
        "kinds": [
            {"kind": "attention", "layers": attention_layers, "grows": True, "bytes": kv},
            {"kind": "linear", "layers": linear_layers, "grows": False, "bytes": state},
        ],
        "bytes": total,
        "all_attention_bytes": all_attention,
        "saving_vs_all_attention": all_attention / total if total else 1.0,
    }
    out["sentence"] = state_sentence(out, fmt)
    return out


def _layers(n: int) -> str:
    return "layer keeps" if n == 1 else "layers keep"


def state_sentence(a: dict, fmt=_mib) -> str:
    att, lin = a["kinds"]
    n = f"{a['context_tokens']:,}"
    head = f"{a['name']}, a {n}-token chat" if a["name"] else f"A {n}-token chat"
    parts = [
        f"{att['layers']} attention {_layers(att['layers'])} all {n} tokens ({fmt(att['bytes'])})"
    ]
    if lin["layers"]:
        parts.append(
            f"{lin['layers']} linear-attention {_layers(lin['layers'])} a fixed state "
            f"whatever its length ({fmt(lin['bytes'])})"
        )
    ratio = a["saving_vs_all_attention"]
    tail = (
        f"{fmt(a['bytes'])} instead of {fmt(a['all_attention_bytes'])} "
        "with attention in every layer"
    )
    tail += (
        f", {ratio:.1f}x less"
        if ratio >= 1.05
        else (f", {1 / ratio:.1f}x more" if ratio < 0.95 else "")
    )
    return f"{head}: {', '.join(parts)}: {tail}"


def crossover_tokens(
    *,
    attention_layers: int,
    linear_layers: int,
    kv_bytes_per_token_layer: float,
    state_bytes_per_layer: int,
) -> int:
    """The chat length from which the hybrid holds less than attention in every layer (its fixed
    states cost as much as the KV the linear layers would have kept)."""
    if not linear_layers or not kv_bytes_per_token_layer:
        return 0
    return -(-state_bytes_per_layer // int(kv_bytes_per_token_layer))


def moe_arithmetic(
    *,
    weights_bytes: int,
    weights_read_per_token_bytes: int,
    num_experts: int,
    top_k: int,
    name: str = "",
    fmt=_mib,
) -> dict:
    """The weights a decode step reads per token (k of E experts) against all the weights held."""
    share = weights_read_per_token_bytes / weights_bytes if weights_bytes else 1.0
    head = f"{name}: " if name else ""
    return {
        "weights_bytes": weights_bytes,
        "weights_read_per_token_bytes": weights_read_per_token_bytes,
        "share": share,
        "sentence": (
            f"{head}each token reads {fmt(weights_read_per_token_bytes)} of "
            f"{fmt(weights_bytes)} of weights ({top_k} of {num_experts} experts "
            f"per layer, {share:.0%})"
        ),
    }
