"""A decoder as data: what each layer's attention, norms, MLP and RoPE are, read from an HF config.

Why: the families we run (Llama, Mistral, Qwen2/3, SmolLM3, Phi-3/4, Gemma 3) differ only in a few
choices per layer, and three forward loops (engine/exec/models/llama.py's eager one, the CPU fused
one, the CUDA fused one) plus the lean C++ step must all make them the same way. Describing a
model once here keeps a new family a description (this file and the weight names in
llama_weights.py), not a fifth loop. Every choice transformers makes that we do not implement is
refused here, in words, so a model never runs with a silently wrong forward.

Per layer: the attention kind (full, or a sliding window of W positions), which RoPE table it
rotates with (None: a layer without RoPE, SmolLM3's every fourth). Per model: q/k RMSNorm per head
(Qwen3, Gemma 3), Gemma's "sandwich" norms (after attention and after the MLP too) and its
(1 + w) RMSNorm weights, the embedding scale, the MLP's activation, the attention scale, partial
rotary (Phi-4-mini rotates 96 of 128 dims), the final logit soft-cap.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "smollm3",
    "phi3",
    "gemma3_text",
    "qwen3_moe",
    "gpt_oss",
    "qwen3_5_text",
    "qwen3_5_moe_text",
)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


from engine.exec.models import hybrid_spec  # noqa: E402
from engine.exec.models.hybrid_spec import UnsupportedModel  # noqa: E402,F401  (raised here too)


@dataclass(frozen=True)
class LayerSpec:
    window: int | None  # sliding-window attention over this many positions; None: full
    rope: str | None  # the RoPE table this layer uses (DecoderSpec.ropes); None: no RoPE
    mixer: str = (
        "attention"  # "attention", or "linear": Gated DeltaNet (hybrid_spec.LinearAttnSpec)
    )
    moe: object = None  # hybrid_spec.MoESpec: this layer's MLP routes to experts; None: dense


@dataclass(frozen=True)
class DecoderSpec:
    family: str  # the config's model_type
    layers: tuple  # LayerSpec per layer
    ropes: tuple  # (name, parameters dict) per RoPE table, as transformers reads them
    head_dim: int
    rotary_dim: int  # dims of each head RoPE rotates (< head_dim: partial rotary)
    qk_norm: bool  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool  # Gemma: norms after attention and after the MLP as well
    norm_plus_one: bool  # Gemma: RMSNorm weights are applied as (1 + w)
    embed_scale: float | None  # Gemma: embeddings times sqrt(hidden), rounded to the model dtype
    act: str  # "silu" or "gelu_tanh" (applied to gate, times up)
    attn_scale: float
    final_softcap: float | None  # logits = cap * tanh(logits / cap)
    fused_weights: bool  # Phi-3: qkv_proj and gate_up_proj are stored fused
    attn_gate: bool = False  # Qwen3.5: attention output times sigmoid(a per-head gate from q_proj)
    sinks: bool = False  # gpt-oss: a learned per-head logit in every softmax's denominator
    linear: object = None  # hybrid_spec.LinearAttnSpec of the model's linear-attention layers

    @property
    def kv_layers(self) -> tuple:
        """The layers that keep KV (attention layers), in order: the KV pool's layer index i is
        the model layer kv_layers[i]."""
        return tuple(i for i, s in enumerate(self.layers) if s.mixer == "attention")

    @property
    def linear_layers(self) -> tuple:
        """The layers that keep a fixed-size state per sequence instead of KV."""
        return tuple(i for i, s in enumerate(self.layers) if s.mixer == "linear")

    @property
    def has_moe(self) -> bool:
        return any(s.moe is not None for s in self.layers)

    @property
    def plain_layers(self) -> bool:
        """Every layer is attention + dense MLP (what the fused loops and the lean step compute)."""
        return not self.linear_layers and not self.has_moe and not self.attn_gate and not self.sinks

    @property
    def windows(self) -> tuple:
        """The distinct sliding windows of the layers (empty: full attention everywhere)."""
        return tuple(sorted({s.window for s in self.layers if s.window}))


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_params(config) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if not params:  # an older config: rope_theta (and rope_scaling) at the top level
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _layer_types(config, n: int) -> list[str]:
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * n


def describe(config) -> DecoderSpec:
    """The DecoderSpec of a transformers config, or UnsupportedModel saying what is missing."""
    config = hybrid_spec.text_config(config)
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        archs = getattr(config, "architectures", None) or [mt]
        raise UnsupportedModel(
            f"unsupported architecture {archs[0]} (model_type {mt!r}): this engine runs "
            f"{', '.join(FAMILIES)} decoders"
        )
    n = int(config.num_hidden_layers)
    d = head_dim_of(config)
    act = ACTIVATIONS.get(
        getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    )
    if act is None:
        raise UnsupportedModel(
            f"the MLP activation {config.hidden_act!r} is not supported (silu, gelu_pytorch_tanh)"
        )
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModel("MLP biases (mlp_bias=true) are not supported")
    if getattr(config, "attn_logit_softcapping", None):
        raise UnsupportedModel("attention logit soft-capping (Gemma 2) is not supported")
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModel(
            "bidirectional attention is not a chat decoder's and is not supported"
        )
    types = _layer_types(config, n)
    window = getattr(config, "sliding_window", None)
    if mt == "mistral":  # every layer (transformers' MistralAttention)
        windows = [window] * n
    elif mt == "llama":  # transformers' Llama has no window: a stray key is ignored
        windows = [None] * n
    elif mt == "smollm3":
        windows = [
            window
            if getattr(config, "use_sliding_window", False) and t == "sliding_attention"
            else None
            for t in types
        ]
    elif mt == "phi3":
        windows = [window] * n  # passed to every layer by transformers' Phi3Attention
    elif mt == "qwen3_moe":  # every layer (None unless use_sliding_window, as HF sets it)
        windows = [window] * n
    else:  # qwen2 / qwen3 / gemma3: the layer types say
        windows = [window if t == "sliding_attention" else None for t in types]
    windows = [int(w) if w else None for w in windows]
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0)
    windows = [None if w and max_pos and w >= max_pos else w for w in windows]  # never binds
    if mt == "gemma3_text":
        per_type = getattr(config, "rope_parameters", None) or {}
        ropes = tuple(
            (t, dict(per_type[t])) for t in sorted(set(types)) if per_type.get(t) is not None
        )
        rope_of = [t for t in types]
    else:
        ropes = (("default", _rope_params(config)),)
        rope_of = ["default"] * n
    if mt == "smollm3":
        no_rope = list(getattr(config, "no_rope_layers", None) or [1] * n)
        rope_of = [r if no_rope[i] else None for i, r in enumerate(rope_of)]
    for name, p in ropes:
        if p.get("rope_type", "default") in ("dynamic",):
            raise UnsupportedModel(
                "dynamic NTK RoPE scaling is not supported (its tables change with length)"
            )
    partial = (
        float(
            dict(ropes[0][1]).get(
                "partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)
            )
            or 1.0
        )
        if mt in ("phi3",) + hybrid_spec.LINEAR_FAMILIES
        else 1.0
    )
    rotary = int(d * partial)
    if rotary % 2 or (d - rotary) % 2:
        raise UnsupportedModel(
            f"partial rotary over {rotary} of {d} dims is not supported (need even splits)"
        )
    gemma = mt == "gemma3_text"
    qwen35 = mt in hybrid_spec.LINEAR_FAMILIES
    mixers = hybrid_spec.mixer_of(config, n, mt)
    moes = [hybrid_spec.describe_moe(config, i, mt) for i in range(n)]
    scale = (float(config.query_pre_attn_scalar) ** -0.5) if gemma else d**-0.5
    cap = getattr(config, "final_logit_softcapping", None) if gemma else None
    return DecoderSpec(
        family=mt,
        layers=tuple(LayerSpec(w, r, x, e) for w, r, x, e in zip(windows, rope_of, mixers, moes)),
        ropes=ropes,
        head_dim=d,
        rotary_dim=rotary,
        qk_norm=mt in ("qwen3", "gemma3_text", "qwen3_moe") or qwen35,
        sandwich_norms=gemma,
        norm_plus_one=gemma or qwen35,
        embed_scale=float(config.hidden_size) ** 0.5 if gemma else None,
        act=act,
        attn_scale=scale,
        final_softcap=float(cap) if cap else None,
        fused_weights=mt == "phi3",
        attn_gate=qwen35,
        sinks=mt == "gpt_oss",
        linear=hybrid_spec.describe_linear(config, mt),
    )


def describe_layers(spec: DecoderSpec) -> str:
    """A short phrase for logs and errors: e.g. '22 sliding (512) + 4 full; RoPE: 2 tables'."""
    by: dict = {}
    for s in spec.layers:
        key = (
            "linear (Gated DeltaNet)"
            if s.mixer == "linear"
            else f"sliding ({s.window})"
            if s.window
            else "full"
        )
        by[key] = by.get(key, 0) + 1
    nope = sum(1 for s in spec.layers if s.rope is None)
    parts = " + ".join(f"{v} {k}" for k, v in by.items())
    moe = [s.moe for s in spec.layers if s.moe is not None]
    if moe:
        parts += f", {len(moe)} MoE ({moe[0].num_experts} experts, top {moe[0].top_k})"
    return parts + (f", {nope} without RoPE" if nope else "")
