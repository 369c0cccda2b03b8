"""What a mixture-of-experts MLP and a Gated DeltaNet layer are, read from a transformers config.

Why a second description beside decoder_spec.py: the newest open models change two parts of the
decoder layer that Llama-shaped ones keep fixed. The MLP becomes a router over E experts of which
each token uses k (Qwen3-MoE, Qwen3.5-MoE with one shared expert, gpt-oss with router biases and a
clamped SwiGLU); and three of every four Qwen3.5 layers replace attention by gated linear attention
(Gated DeltaNet): a fixed-size recurrent state per sequence instead of KV per token. These are
data for the one forward loop (engine/exec/models/llama.py), like the window and RoPE table of a
layer; a config asking for something the loop does not compute is refused in words.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedModel(ValueError):
    """The config names something this engine cannot compute exactly (a sentence for the user);
    decoder_spec.describe raises it too."""


MOE_FAMILIES = ("qwen3_moe", "qwen3_5_moe_text", "gpt_oss")
LINEAR_FAMILIES = ("qwen3_5_text", "qwen3_5_moe_text")
# multimodal wrappers whose text model is one of ours: the loader takes `text_config`
TEXT_OF = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


@dataclass(frozen=True)
class MoESpec:
    """The routed MLP. router "softmax_topk" (Qwen): softmax over all E logits in fp32, the k
    largest, renormalised to sum 1 when `renormalize`; "topk_softmax" (gpt-oss): the k largest
    logits (router bias added), softmax over those k. act "silu": silu(gate) * up; "swiglu_clamp"
    (gpt-oss): gate clamped above at `limit`, up to [-limit, limit], gate * sigmoid(alpha * gate)
    * (up + 1). `shared`: the intermediate size of an always-on expert (0: none), scaled by
    sigmoid(x . w) (Qwen3.5-MoE, Qwen3-Next)."""

    num_experts: int
    top_k: int
    intermediate: int
    router: str
    renormalize: bool
    router_bias: bool
    act: str
    expert_bias: bool
    alpha: float = 0.0
    limit: float = 0.0
    shared: int = 0

    def active_params_per_layer(self, hidden: int) -> int:
        """Weights one token reads in this layer's MLP: k experts (+ shared) and the router."""
        per = 3 * hidden * self.intermediate
        return self.top_k * per + 3 * hidden * self.shared + self.num_experts * hidden


@dataclass(frozen=True)
class LinearAttnSpec:
    """Gated DeltaNet (Qwen3.5 / Qwen3-Next): q and k heads of k_dim, v heads of v_dim (num_v_heads
    a multiple of num_k_heads), a causal depthwise convolution of `conv_kernel` taps over the
    concatenated q, k, v channels. Per sequence and layer it keeps a recurrent state
    [num_v_heads, k_dim, v_dim] (fp32) and the last conv_kernel - 1 inputs of the convolution."""

    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_dim

    def state_bytes(self, conv_itemsize: int) -> int:
        """One sequence's state in one layer: the fp32 recurrent state and the conv tail."""
        rec = self.num_v_heads * self.k_dim * self.v_dim * 4
        return rec + self.conv_dim * (self.conv_kernel - 1) * conv_itemsize


def describe_moe(config, layer_index: int, mt: str) -> MoESpec | None:
    """The MoE MLP of layer `layer_index`, or None where the layer's MLP is dense."""
    if mt not in MOE_FAMILIES:
        return None
    if mt == "gpt_oss":
        return MoESpec(
            int(config.num_local_experts),
            int(config.num_experts_per_tok),
            int(config.intermediate_size),
            "topk_softmax",
            False,
            True,
            "swiglu_clamp",
            True,
            alpha=float(config.swiglu_alpha),
            limit=float(config.swiglu_limit),
        )
    experts = int(getattr(config, "num_experts", 0) or 0)
    if mt == "qwen3_moe":
        sparse = (
            layer_index not in (getattr(config, "mlp_only_layers", None) or [])
            and experts > 0
            and (layer_index + 1) % int(config.decoder_sparse_step) == 0
        )
        if not sparse:
            return None
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"expert activation {config.hidden_act!r} is not supported (silu)")
    renorm = bool(getattr(config, "norm_topk_prob", True)) if mt == "qwen3_moe" else True
    shared = (
        int(getattr(config, "shared_expert_intermediate_size", 0) or 0) if mt != "qwen3_moe" else 0
    )
    return MoESpec(
        experts,
        int(config.num_experts_per_tok),
        int(config.moe_intermediate_size),
        "softmax_topk",
        renorm,
        False,
        "silu",
        False,
        shared=shared,
    )


def describe_linear(config, mt: str) -> LinearAttnSpec | None:
    """The Gated DeltaNet layers' shape, or None for a model without linear attention."""
    if mt not in LINEAR_FAMILIES:
        return None
    spec = LinearAttnSpec(
        int(config.linear_num_key_heads),
        int(config.linear_num_value_heads),
        int(config.linear_key_head_dim),
        int(config.linear_value_head_dim),
        int(config.linear_conv_kernel_dim),
    )
    if spec.num_v_heads % spec.num_k_heads:
        raise UnsupportedModel("linear attention needs num_value_heads a multiple of num_key_heads")
    if spec.conv_kernel < 2:
        raise UnsupportedModel(
            "a linear-attention convolution of fewer than 2 taps is not supported"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(
            f"linear-attention activation {config.hidden_act!r} is not supported"
        )
    return spec


def mixer_of(config, n: int, mt: str) -> list[str]:
    """'attention' or 'linear' per layer (Qwen3.5's layer_types name 'linear_attention')."""
    if mt not in LINEAR_FAMILIES:
        return ["attention"] * n
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != n:
        raise UnsupportedModel(f"layer_types names {len(types)} layers, the model has {n}")
    return ["linear" if t == "linear_attention" else "attention" for t in types]


def text_config(config):
    """A multimodal wrapper (Qwen3.5's ForConditionalGeneration config) -> its text config, which is
    what the engine runs; any other config as it is."""
    if (
        getattr(config, "model_type", None) in TEXT_OF
        and getattr(config, "text_config", None) is not None
    ):
        return config.text_config
    return config


def params_per_token(spec, config) -> tuple[int, int]:
    """(weights held, weights one decoded token reads), as parameter counts from the description:
    per layer its mixer (attention projections, or a linear-attention layer's projections and conv
    taps) and its MLP (dense, or the router, k experts and the shared one of E), plus the LM head
    (every token reads all of it; the embedding only its row). Norms are left out (tiny)."""
    hidden, vocab = int(config.hidden_size), int(config.vocab_size)
    h = int(config.num_attention_heads)
    kvh = int(getattr(config, "num_key_value_heads", None) or h)
    d = spec.head_dim
    total = active = vocab * hidden  # the LM head (tied or not: read per token)
    if not getattr(config, "tie_word_embeddings", False):
        total += vocab * hidden  # the embedding table, one row read
    active += hidden
    for s in spec.layers:
        if s.mixer == "linear":
            lin = spec.linear
            mix = (
                hidden * (lin.conv_dim + lin.value_dim + 2 * lin.num_v_heads)
                + lin.value_dim * hidden
                + lin.conv_dim * lin.conv_kernel
            )
        else:
            mix = (
                hidden * (h + 2 * kvh) * d
                + h * d * hidden
                + (hidden * h * d if spec.attn_gate else 0)
            )
        if s.moe is not None:
            held = (
                s.moe.num_experts * 3 * hidden * s.moe.intermediate
                + s.moe.num_experts * hidden
                + 3 * hidden * s.moe.shared
            )
            read = s.moe.active_params_per_layer(hidden)
        else:
            held = read = 3 * hidden * int(config.intermediate_size)
        total += mix + held
        active += mix + read
    return total, active
