"""A decoder checkpoint's weights in the form the forward pass runs them, and one copy per process.

Preparing means: every tensor in the model's dtype on its device; q/k/v and gate/up fused into one
matrix each (Phi-3 stores them fused already); the family's layout made the one the loops read
(engine/exec/models/decoder_spec.py): Gemma's (1 + w) norm weights added up in fp32, a partial
rotary model's q and k rows permuted per head (engine/exec/models/rope.py); on CPU, each layer's
GEMM weight made a callable from engine/exec/cpu_linear.py (dense, oneDNN-packed or int8, biases
inside). Packing is a reorder of every weight, ~0.5 s of CPU for the
135M default model and proportionally more for bigger ones, paid again by every engine a process
builds (the benchmarks and the tests build hundreds).

Why sharing is safe: what is prepared is never written afterwards. The linears are read-only
callables (two engines may call one at once from their own threads), and each engine gets its own
list of layer dicts; whatever an engine changes per instance (its lean step, its KV rotation, its
rope tables) lives on its LlamaModel, not here. Only weights the loader read from a folder are shared
(`key`: the folder and its weight files' sizes and times; a changed file prepares anew); random or
hand-made weights are prepared for the one model that asked. One entry is kept: a process serves
one model, and the entry is what its engine would hold anyway.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import torch

LINEAR_NAMES = ("qkv", "o", "gate_up", "down")
MIXER_LINEAR_NAMES = ("lin_in", "lin_out")  # a Gated DeltaNet layer's GEMMs (gated_deltanet.py)


@dataclass(frozen=True)
class PreparedWeights:
    embed: torch.Tensor
    lm_head: torch.Tensor
    norm: torch.Tensor
    layers: tuple  # per layer: {"ln1", "ln2", "qkv", "o", "gate_up", "down"[, "*_b" on CUDA]
    # [, "q_norm", "k_norm" (per head), "post_attn", "post_ff" (Gemma)]}
    lm_head_linear: object  # CPU: a cpu_linear callable; CUDA: None
    linear_kind: str  # cpu_linear.describe() of the layers' linears ("dense" on CUDA)
    plain: tuple  # CPU: per layer, the tensors the lean step reads: those the linears were
    # made from, or, beside packed linears, their copies in the lean step's tiled
    # layout (kernels/lean_products.tile_rows); () in a shared entry whose
    # copy was too big to keep
    plain_extra_bytes: int  # what keeping `plain` costs beside the linears (packed ones only)


_lock = threading.Lock()
_shared: dict = {}  # at most one entry: (key, dtype, device, quantization, packed) -> PreparedWeights


def prepared_weights(
    config,
    weights: dict,
    dtype: torch.dtype,
    device,
    quantization: str | None,
    key: tuple | None = None,
    keep_plain_upto: int = 0,
    spec=None,
) -> PreparedWeights:
    """The prepared form of `weights`: shared with earlier engines of this process when `key`
    (see the module docstring) and the form asked for are the same. A shared entry keeps the plain
    copy only up to `keep_plain_upto` bytes (what a lean step on "auto" would keep); unshared
    ones keep it for the caller to use or drop."""
    if spec is None:
        from engine.exec.models.decoder_spec import describe

        spec = describe(config)
    if key is None:
        return _prepare(config, weights, dtype, device, quantization, keep_plain_upto, spec)
    from engine.exec.cpu_linear import packed_fp32_enabled
    from engine.exec.huge_pages import enabled as huge_pages

    full = (
        key,
        str(dtype),
        str(torch.device(device)),
        quantization,
        packed_fp32_enabled(),
        huge_pages(),
    )
    with _lock:
        if full not in _shared:
            _shared.clear()  # drop the previous model before building the next
            prep = _prepare(config, weights, dtype, device, quantization, keep_plain_upto, spec)
            if prep.plain_extra_bytes > keep_plain_upto:
                prep = replace(prep, plain=())
            _shared[full] = prep
        return _shared[full]


def _cat(*ts):
    return None if ts[0] is None else torch.cat(ts, dim=0).contiguous()


def _prepare(
    config, weights: dict, dtype, device, quantization, tile_upto: int = 0, spec=None
) -> PreparedWeights:
    """`tile_upto`: the packed linears' plain copy is tiled only up to this many bytes (where a lean
    step on "auto" would keep it): tiling a copy that is then dropped would be wasted time, and the
    tiled tensors are new memory while the checkpoint's own tensors are still held."""
    from engine.exec.models.rope import partial_rotary_perm

    if spec is None:
        from engine.exec.models.decoder_spec import describe

        spec = describe(config)

    def w(name):
        if name not in weights:
            raise ValueError(f"checkpoint is missing weight {name!r}")
        return weights[name].to(device=device, dtype=dtype).contiguous()

    def opt(name):
        return w(name) if name in weights else None

    def norm(name):  # Gemma: (1 + w) kept in fp32, as its RMSNorm multiplies in fp32
        if not spec.norm_plus_one:
            return w(name)
        if name not in weights:
            raise ValueError(f"checkpoint is missing weight {name!r}")
        return (1.0 + weights[name].to(dtype).float()).to(device=device).contiguous()

    h, kvh, d = (
        config.num_attention_heads,
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        spec.head_dim,
    )
    perm = partial_rotary_perm(d, spec.rotary_dim)

    def qk_rows(t):  # partial rotary: permute each q and k head's rows (v untouched)
        if perm is None or t is None:
            return t
        heads = t.view(h + 2 * kvh, d, *t.shape[1:])
        qk = heads[: h + kvh].index_select(1, perm.to(t.device))
        return torch.cat((qk, heads[h + kvh :])).reshape(t.shape).contiguous()

    embed = w("model.embed_tokens.weight")
    tied = getattr(config, "tie_word_embeddings", False) or "lm_head.weight" not in weights
    lm_head = embed if tied else w("lm_head.weight")
    layers = [
        _prepare_layer(i, weights, spec, w, opt, norm, qk_rows, h, d)
        for i in range(config.num_hidden_layers)
    ]
    final_norm = norm("model.norm.weight")
    if torch.device(device).type != "cpu":
        if quantization is not None:
            raise ValueError("quantization='int8' is a CPU option (torch's CPU int8 weight kernel)")
        return PreparedWeights(embed, lm_head, final_norm, tuple(layers), None, "dense", (), 0)
    # CPU: each layer's GEMM weights become callables (dense fp32, oneDNN-packed, or int8), biases
    # inside them; the plain tensors they were made from are kept for the lean step to keep or drop.
    # Beside packed linears that copy is the lean step's alone, so it is kept in the lean step's
    # column-block layout (all layers or none), whose outer-product kernels beat the row-major dot
    # products 1.1x at one row and 1.5-1.8x at 8-16 (kernels/csrc/lean_gemm.h, gemm_blocks)
    from engine.exec.cpu_linear import PackedLinear, describe, make_linear
    from kernels.lean_products import can_tile, tile_rows

    plain, extra = [], 0
    tile = spec.plain_layers and all(
        can_tile(L[n], 2 if n == "gate_up" else 1) for L in layers for n in LINEAR_NAMES
    )
    for L in layers:
        plain.append({})
        for name in LINEAR_NAMES + MIXER_LINEAR_NAMES:
            if name not in L:  # a linear-attention layer has no qkv; an MoE layer no gate_up
                continue
            bias = L.pop(name + "_b", None)
            plain[-1][name], plain[-1][name + "_b"] = L[name], bias
            L[name] = make_linear(L[name], bias, quantization=quantization)
            if isinstance(L[name], PackedLinear):  # dense and int8 linears share the tensors
                extra += plain[-1][name].numel() * plain[-1][name].element_size()
    tiled = tile and 0 < extra <= tile_upto
    if tiled:
        for L, P in zip(layers, plain):
            for name in LINEAR_NAMES:
                if name in L and isinstance(L[name], PackedLinear):
                    P[name] = tile_rows(P[name])
    head = make_linear(lm_head, None, quantization=quantization)
    embed, lm_head = _to_huge_pages(layers, plain, embed, lm_head, head, tiled)
    first = next((L[n] for L in layers for n in LINEAR_NAMES + MIXER_LINEAR_NAMES if n in L), None)
    kind = describe(first) if first is not None else "dense"
    return PreparedWeights(
        embed, lm_head, final_norm, tuple(layers), head, kind, tuple(plain), extra
    )


def _to_huge_pages(layers, plain, embed, lm_head, head, tiled: bool):
    """Move what the lean step streams every token onto 2 MiB pages (engine/exec/huge_pages.py):
    each layer's GEMM weights where a dense linear shares them with `plain` (they move for both,
    so nothing is held twice) or the tiled copies beside packed linears, an int8 linear's codes,
    and the embedding / LM head. An untiled copy beside packed linears stays where it is: it is
    dropped when too big to keep, and in the arena it would live as long as the embedding.
    Returns the new (embed, lm_head)."""
    from engine.exec.cpu_linear import DenseLinear, Int8Linear
    from engine.exec.huge_pages import arena_for

    slots = []  # (tensor, setter): where each moved tensor goes back

    def add(t, put):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            slots.append((t, put))

    for L, P in zip(layers, plain):
        for name in LINEAR_NAMES + MIXER_LINEAR_NAMES:
            lin = L.get(name)
            if isinstance(lin, Int8Linear):
                add(lin.q, lambda v, lin=lin: setattr(lin, "q", v))
            elif isinstance(lin, DenseLinear) and P.get(name) is lin.weight:
                add(
                    lin.weight,
                    lambda v, lin=lin, P=P, n=name: (setattr(lin, "weight", v), P.update({n: v})),
                )
            elif tiled and name in P:
                add(P[name], lambda v, P=P, n=name: P.update({n: v}))
    moved = {"embed": embed, "lm_head": lm_head}
    add(embed, lambda v: moved.update(embed=v))
    if lm_head is not embed:
        add(lm_head, lambda v: moved.update(lm_head=v))
    if isinstance(head, Int8Linear):
        add(head.q, lambda v: setattr(head, "q", v))
    arena = arena_for([t for t, _ in slots])
    if arena is None:
        return embed, lm_head
    while slots:  # each original dropped after its copy (unless the loader still holds it)
        t, put = slots.pop(0)
        put(arena.take(t))
        del t
    if lm_head is embed:
        moved["lm_head"] = moved["embed"]
    if isinstance(head, DenseLinear) and head.weight is lm_head:
        head.weight = moved["lm_head"]
    return moved["embed"], moved["lm_head"]


def _prepare_layer(i, weights, spec, w, opt, norm, qk_rows, h, d) -> dict:
    """Layer i's tensors: norms, its mixer (attention: fused qkv [+ Qwen3.5's gate rows, gpt-oss's
    sinks]; linear attention: gated_deltanet.prepare_linear_layer) and its MLP (dense gate_up +
    down, or the experts: moe.prepare_moe)."""
    p = f"model.layers.{i}."
    a = p + "self_attn."
    s = spec.layers[i]
    L = {
        "ln1": norm(p + "input_layernorm.weight"),
        "ln2": norm(
            p
            + (
                "pre_feedforward_layernorm.weight"
                if spec.sandwich_norms
                else "post_attention_layernorm.weight"
            )
        ),
    }
    if s.mixer == "linear":
        from engine.exec.models.gated_deltanet import prepare_linear_layer

        L.update(prepare_linear_layer(p, spec.linear, w))
    else:
        if spec.fused_weights:
            qkv, biases = w(a + "qkv_proj.weight"), [opt(a + "qkv_proj.bias")]
        else:
            qw, qb = w(a + "q_proj.weight"), opt(a + "q_proj.bias")
            gate = gate_b = None
            if spec.attn_gate:  # Qwen3.5: q_proj holds per head d query rows, then d gate rows
                qw, gate = qw.view(h, 2, d, -1).unbind(1)
                qw, gate = qw.reshape(h * d, -1), gate.reshape(h * d, -1)
                if qb is not None:
                    qb, gate_b = (t.reshape(h * d) for t in qb.view(h, 2, d).unbind(1))
            qkv = _cat(qw, w(a + "k_proj.weight"), w(a + "v_proj.weight"))
            biases = [qb, opt(a + "k_proj.bias"), opt(a + "v_proj.bias")]
        if any(b is not None for b in biases) and any(b is None for b in biases):
            raise ValueError(f"layer {i}: q/k/v projections must all have a bias or none")
        L["qkv"], L["qkv_b"] = qk_rows(qkv), qk_rows(_cat(*biases))
        if spec.attn_gate:  # the gate rows follow q, k, v in the one GEMM (not permuted)
            L["qkv"] = torch.cat((L["qkv"], gate.contiguous())).contiguous()
            if L["qkv_b"] is not None:
                L["qkv_b"] = torch.cat(
                    (
                        L["qkv_b"],
                        gate_b if gate_b is not None else torch.zeros_like(L["qkv_b"][: h * d]),
                    )
                )
        L["o"], L["o_b"] = w(a + "o_proj.weight"), opt(a + "o_proj.bias")
        if spec.sinks:
            L["sinks"] = w(a + "sinks").float().contiguous()
        if spec.qk_norm:
            perm = _perm_of(spec)
            qn, kn = norm(a + "q_norm.weight"), norm(a + "k_norm.weight")
            L["q_norm"], L["k_norm"] = (qn, kn) if perm is None else (qn[perm], kn[perm])
    if s.moe is not None:
        from engine.exec.models.moe import prepare_moe

        L.update(prepare_moe(weights, p + "mlp.", s.moe, w, opt))
    elif spec.fused_weights:
        L["gate_up"], L["down"] = w(p + "mlp.gate_up_proj.weight"), w(p + "mlp.down_proj.weight")
    else:
        L["gate_up"] = _cat(w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight"))
        L["down"] = w(p + "mlp.down_proj.weight")
    if spec.sandwich_norms:
        L["post_attn"] = norm(p + "post_attention_layernorm.weight")
        L["post_ff"] = norm(p + "post_feedforward_layernorm.weight")
    return L


def _perm_of(spec):
    from engine.exec.models.rope import partial_rotary_perm

    return partial_rotary_perm(spec.head_dim, spec.rotary_dim)
