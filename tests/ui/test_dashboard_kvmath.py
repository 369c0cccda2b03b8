"""KV arithmetic: bytes per token (GQA vs MHA), traditional vs paged table, block-size what-if."""

from types import SimpleNamespace

import pytest

from ui.dashboard import panels as H
from ui.dashboard.kv_math import (
    PRESETS,
    ModelShape,
    batch_table,
    block_size_whatif,
    fmt_bytes,
    kv_bytes_per_token,
    shape_from_config,
)

SMOL_CFG = SimpleNamespace(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576
)  # no head_dim attribute: 576 / 9 = 64


def test_smollm2_bytes_per_token_with_kv_heads_and_with_attention_heads():
    m = shape_from_config(SMOL_CFG, "float32", 8192, name="SmolLM2-135M")
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.dtype_bytes) == (30, 9, 3, 64, 4)
    assert m.bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert m.mha_bytes_per_token == 2 * 30 * 9 * 64 * 4 == 138_240
    assert m.gqa_factor == 3.0
    assert kv_bytes_per_token(30, 3, 64, 4) * 16 == 737_280


def test_presets_known_values():
    by = {p.name: p for p in PRESETS}
    assert by["Llama-2-7B"].bytes_per_token == 524_288  # 0.5 MiB/token, MHA
    assert by["Llama-2-7B"].mha_bytes_per_token == 524_288
    assert by["Llama-3-70B"].bytes_per_token == 327_680  # 8 KV heads
    assert by["Llama-3-70B"].mha_bytes_per_token == 2_621_440  # 64 heads: 8x more
    assert by["Mistral-7B"].bytes_per_token == 131_072


def test_head_dim_from_config_and_torch_dtype_names():
    cfg = SimpleNamespace(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=None,
        hidden_size=64,
        head_dim=32,
    )
    m = shape_from_config(cfg, "torch.bfloat16", 128)
    assert (m.kv_heads, m.head_dim, m.dtype) == (4, 32, "bfloat16")
    assert m.bytes_per_token == 2 * 2 * 4 * 32 * 2


def test_batch_table_traditional_vs_paged():
    m = ModelShape("t", 30, 9, 3, 64, "float32", 8192)
    rows = batch_table(m, 100.4, 16, pool_bytes=3000 * 16 * 46_080)
    assert [r["batch"] for r in rows] == [1, 8, 32, 64]
    r1, r64 = rows[0], rows[-1]
    assert r1["traditional_bytes"] == 8192 * 46_080  # 360 MiB
    assert r1["paged_bytes"] == 112 * 46_080  # 100 tokens -> 7 blocks of 16
    assert r64["paged_bytes"] == 64 * 112 * 46_080
    assert r1["waste_paged_frac"] == pytest.approx(12 / 112)
    assert r1["waste_traditional_frac"] == pytest.approx(1 - 100 / 8192)
    assert r1["saved_frac"] == pytest.approx(1 - 112 / 8192)
    assert (
        r1["fits_traditional"] is True and rows[1]["fits_traditional"] is False
    )  # 8 x 360 MiB > 2.06 GiB
    assert r64["fits_paged"] is True


def test_block_size_whatif_known_answer():
    seqs = [{"num_computed": 10}, {"num_computed": 33}, {"num_computed": 64}]
    rows = {r["block_size"]: r for r in block_size_whatif(seqs, 16)}
    assert sorted(rows) == [8, 16, 32, 64]
    # b=8: 2+5+8 = 15 blocks, waste 6+7+0 = 13; b=16: 1+3+4 = 8, waste 6+15+0 = 21
    assert (rows[8]["table_entries"], rows[8]["frag_tokens"]) == (15, 13)
    assert (rows[16]["table_entries"], rows[16]["frag_tokens"], rows[16]["current"]) == (
        8,
        21,
        True,
    )
    # b=32: 1+2+2 = 5, waste 22+31+0 = 53; b=64: 3 blocks, waste 54+31+0 = 85
    assert (rows[32]["table_entries"], rows[32]["frag_tokens"]) == (5, 53)
    assert (rows[64]["table_entries"], rows[64]["frag_tokens"], rows[64]["max_table_len"]) == (
        3,
        85,
        1,
    )
    assert rows[8]["table_bytes"] == 60 and rows[8]["max_table_len"] == 8
    assert rows[64]["frag_frac"] == pytest.approx(85 / 192)
    assert block_size_whatif([], 128)[-1]["block_size"] == 128  # the live size is always a row


def test_arithmetic_and_whatif_html_show_live_numbers():
    m = shape_from_config(SMOL_CFG, "float32", 8192, name="SmolLM2-135M")
    html = H.arithmetic_html(m, 46_080, 16, 3000, 290.0)
    assert "2 (K,V) × 30 layers × 3 KV heads × 64 head_dim × 4 B (float32)" in html
    assert 'data-k="bytes_per_token" data-v="46080"' in html
    assert 'data-k="mha_bytes_per_token" data-v="138240"' in html and "3.0× less" in html
    assert "live average sequence length (290 tokens)" in html
    assert "Llama-3-70B" in html and "2,621,440 B" in html
    assert "reports" not in html  # engine agrees with the formula
    assert "The engine reports 1 B/token" in H.arithmetic_html(m, 1, 16, 3000, None)
    preset = H.arithmetic_html(m, 46_080, 16, 3000, None, PRESETS[0])
    assert "Llama-2-7B at 256 tokens (no live sequences yet)" in preset
    w = H.whatif_html([{"num_computed": 10}, {"num_computed": 33}], 16)
    assert 'data-k="frag_8" data-v="13"' in w and "16 (live)" in w


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1,023 B"),
        (737_280, "720 KiB"),
        (2_211_840, "2.11 MiB"),
        (2 * 1024**3, "2.00 GiB"),
        (48 * 1024**3, "48.0 GiB"),
        (360 * 1024**2, "360 MiB"),
    ],
)
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


def test_int8_kv_shape_counts_its_scales_and_says_what_it_buys():
    """Memory tab, issue 22: an int8 pool's row is head_dim codes + a 4-byte scale, and the panel
    states the tokens the same bytes hold next to what the weights' dtype would hold."""
    import re
    from ui.dashboard.kv_math import ModelShape, shape_of
    from ui.dashboard.panels import arithmetic_html

    m = ModelShape("live", 30, 9, 3, 64, "int8", 8192, weights_dtype="bfloat16")
    assert m.bytes_per_token == 12_240 and m.weights_bytes_per_token == 23_040
    html = arithmetic_html(m, 12_240, 16, 10_000, None)
    assert "The engine reports" not in html  # agrees with the engine's figure
    text = re.sub("<[^>]+>", "", html)
    assert "+ 4 B scale" in text and "12,240 B/token" in text
    assert "160,000 tokens in 1.82 GiB — 1.88× what bfloat16 would hold (85,000 tokens" in text
    same = ModelShape("live", 30, 9, 3, 64, "bfloat16", 8192)
    assert "would hold" not in arithmetic_html(same, same.bytes_per_token, 16, 10_000, None)

    class Info:  # engine/exec/model_info.ModelInfo's fields that shape_of reads
        name, num_layers, num_attention_heads, num_kv_heads, head_dim = "m", 30, 9, 3, 64
        dtype, kv_cache_dtype, max_model_len = "float32", "int8", 8192

    s = shape_of(Info)
    assert s.dtype == "int8" and s.weights_dtype == "float32" and s.bytes_per_token == 12_240
