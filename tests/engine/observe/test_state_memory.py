"""What is not KV, as numbers from the shipped configs (engine/observe/state_memory.py): a Qwen3.5
chat's memory per layer kind against attention in every layer and against a Qwen3 of about the same
size, and the weights one token of a mixture of experts reads. Expected values are computed here
from the config's own fields (not from the engine's description of it)."""

from engine.exec import dummy_weights as dw
from engine.exec.models.decoder_spec import describe
from engine.exec.models.hybrid_spec import params_per_token
from engine.observe.kv_groups import kv_arithmetic
from engine.observe.state_memory import crossover_tokens, moe_arithmetic, state_arithmetic


def test_qwen35_chat_costs_a_quarter_of_the_kv_and_a_fixed_state():
    c = dw.load_config("qwen3.5-0.8b")
    types = c.layer_types
    att, lin = types.count("full_attention"), types.count("linear_attention")
    assert (att, lin) == (6, 18)
    bf16 = 2
    kv_layer = 2 * c.num_key_value_heads * c.head_dim * bf16  # K + V of one token
    conv_dim = (
        2 * c.linear_num_key_heads * c.linear_key_head_dim
        + c.linear_num_value_heads * c.linear_value_head_dim
    )
    state_layer = (
        c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
        + conv_dim * (c.linear_conv_kernel_dim - 1) * bf16
    )
    assert describe(c).linear.state_bytes(bf16) == state_layer
    a = state_arithmetic(
        attention_layers=att,
        linear_layers=lin,
        kv_bytes_per_token_layer=kv_layer,
        state_bytes_per_layer=state_layer,
        context_tokens=32768,
        name="Qwen3.5-0.8B",
    )
    assert a["bytes"] == att * 32768 * kv_layer + lin * state_layer
    assert a["all_attention_bytes"] == 24 * 32768 * kv_layer
    assert 3.5 < a["saving_vs_all_attention"] < 4.0
    assert a["sentence"] == (
        "Qwen3.5-0.8B, a 32,768-token chat: 6 attention layers keep all 32,768 tokens (384 MiB), "
        "18 linear-attention layers keep a fixed state whatever its length (19 MiB): 403 MiB "
        "instead of 1,536 MiB with attention in every layer, 3.8x less"
    )
    # a short chat: the fixed states cost more than the KV they replace, until this many tokens
    n = crossover_tokens(
        attention_layers=att,
        linear_layers=lin,
        kv_bytes_per_token_layer=kv_layer,
        state_bytes_per_layer=state_layer,
    )
    assert n == -(-state_layer // kv_layer) == 530
    short = state_arithmetic(
        attention_layers=att,
        linear_layers=lin,
        kv_bytes_per_token_layer=kv_layer,
        state_bytes_per_layer=state_layer,
        context_tokens=256,
    )
    assert short["saving_vs_all_attention"] < 1 and "more" in short["sentence"]
    # beside a Qwen3 of about the same size (Qwen3-0.6B: 28 attention layers, 8 KV heads of 128)
    q3 = dw.load_config("qwen3-0.6b")
    peer = kv_arithmetic(
        [None] * q3.num_hidden_layers,
        kv_heads=q3.num_key_value_heads,
        head_dim=q3.head_dim,
        dtype_bytes=bf16,
        context_tokens=32768,
        name="Qwen3-0.6B",
    )
    assert peer["bytes"] == 28 * 32768 * 2 * 8 * 128 * 2
    assert 8 < peer["bytes"] / a["bytes"] < 9


def test_moe_reads_its_active_experts_only():
    c = dw.load_config("qwen3-30b-a3b")
    total, active = params_per_token(describe(c), c)
    # Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active (its model card, which counts the whole
    # embedding table as active; a token reads one row of it); norms left out here
    emb = c.vocab_size * c.hidden_size
    assert 30.0e9 < total < 31.0e9 and 3.2e9 < active + emb < 3.4e9
    m = moe_arithmetic(
        weights_bytes=total * 2,
        weights_read_per_token_bytes=active * 2,
        num_experts=128,
        top_k=8,
        name="Qwen3-30B-A3B",
    )
    assert m["sentence"].endswith(
        "reads 5,802 MiB of 58,235 MiB of weights (8 of 128 experts per layer, 10%)"
    )
    g = dw.load_config("gpt-oss-20b")
    total, active = params_per_token(describe(g), g)
    assert (
        20.8e9 < total < 21.0e9 and 3.55e9 < active < 3.65e9
    )  # 20.9 B, 3.6 B active (its model card)
