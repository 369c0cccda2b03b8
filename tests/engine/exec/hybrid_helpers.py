"""Shared by the tests of the MoE and linear-attention families: the shipped configs shrunk to 2-4
layers that keep their layer kinds, seeded random weights, HF's model on the very same tensors."""

import torch

from engine.exec import dummy_weights as dw

SHRINK = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=300,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    max_position_embeddings=512,
    initializer_range=0.1,
)
MOE = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)
W = 24  # gpt-oss's shrunk window: shorter than the prompts, not a multiple of the 16-token block
FAMILIES = {  # shipped config -> what keeps its layer kinds at this size
    "qwen3_moe": ("qwen3-30b-a3b", dict(num_hidden_layers=2, mlp_only_layers=[1], **MOE)),
    "gpt_oss": (
        "gpt-oss-20b",
        dict(
            num_hidden_layers=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=W,
            layer_types=["sliding_attention", "full_attention"],
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 128,
                "truncate": False,
            },
        ),
    ),
    "qwen3_5": (
        "qwen3.5-0.8b",
        dict(
            num_hidden_layers=4, **LINEAR, layer_types=["linear_attention"] * 3 + ["full_attention"]
        ),
    ),
    "qwen3_5_moe": (
        "qwen3.5-35b-a3b",
        dict(
            num_hidden_layers=4,
            shared_expert_intermediate_size=48,
            **MOE,
            **LINEAR,
            layer_types=["linear_attention", "full_attention"] * 2,
        ),
    ),
}


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


def config(family):
    name, over = FAMILIES[family]
    return dw.load_config(name, {**SHRINK, **over})


def weights(family, cfg=None):
    """The seeded random weights a dummy engine of the family holds (seed 0)."""
    return dw.random_weights(cfg or config(family), seed=0)


_HF = {}


def hf_model(family):
    if family not in _HF:
        cfg = config(family)
        _HF[family] = dw.hf_model_with_weights(cfg, weights(family, cfg))
    return _HF[family]


def hf_logits(family, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(family)(torch.tensor([list(ids)])).logits[0]


def assert_hf_greedy(family, prompt_ids, tokens):
    """Each generated token is HF's argmax after the prompt and the tokens before it."""
    want = (
        hf_logits(family, list(prompt_ids) + list(tokens[:-1]))[len(prompt_ids) - 1 :]
        .argmax(-1)
        .tolist()
    )
    assert list(tokens) == want, f"{family}: engine {list(tokens)} != HF {want}"


def make_llm(family, **kw):
    """An engine on the family's shrunk config, holding `weights(family)`."""
    from engine import LLM

    name, over = FAMILIES[family]
    kw.setdefault("num_blocks", 24)
    kw.setdefault("max_num_batched_tokens", 32)
    return LLM(
        model=name,
        load_format="dummy",
        hf_overrides={**SHRINK, **over},
        seed=0,
        device="cpu",
        block_size=16,
        **kw,
    )
