"""The families we run, shrunk from their shipped configs to a few layers that keep their layer kinds,
and the prompts their tests share (test_families_vs_hf.py, test_gguf_families.py). Here so that no
test module imports another."""

import torch


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
    initializer_range=0.15,
)  # peaked attention: RoPE, windows and norms change the tokens
W = 24  # every shrunk window: shorter than the prompts, not a multiple of the 16-token block
FAMILIES = {  # shipped config -> what keeps its layer kinds at this size
    "qwen3": ("qwen3-0.6b", dict(num_hidden_layers=2)),
    "gemma3": (
        "gemma-3-1b",
        dict(
            num_hidden_layers=4,
            sliding_window=W,
            query_pre_attn_scalar=16,
            final_logit_softcapping=30.0,
            layer_types=[
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
            ],
        ),
    ),
    "smollm3": ("smollm3-3b", dict(num_hidden_layers=4)),  # layer 3 without RoPE
    "phi4": (
        "phi-4-mini",
        dict(
            num_hidden_layers=2,
            original_max_position_embeddings=32,
            sliding_window=None,
            rope_scaling={
                "type": "longrope",
                "long_factor": [1.0 + 0.4 * i for i in range(6)],
                "short_factor": [1.0 + 0.05 * i for i in range(6)],
            },
        ),
    ),
    "mistral": ("mistral-7b-v0.1", dict(num_hidden_layers=2, sliding_window=W)),
    "qwen2-window": (
        "qwen2.5-0.5b",
        dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=W, max_window_layers=1),
    ),
    "llama-yarn": (
        "llama-3.2-1b",
        dict(
            num_hidden_layers=2,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
}


def random_prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


A = random_prompt(1, 70)
