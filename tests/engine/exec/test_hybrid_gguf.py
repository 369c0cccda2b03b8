"""A GGUF per MoE / linear-attention architecture, written here as llama.cpp's converter writes one
(tests/engine/exec/gguf_write_hybrid.py), loaded by the engine (engine/exec/loader.py) and compared:
- F32 files against HF transformers on the original weights: the mapping back (names, Qwen3.5's
  1 + w norms, -exp(A_log), squeezed conv, tiled v heads; gpt-oss's split gate / up and [E, out,
  in] experts) is exact, so the fp32 logits agree within 1e-4 (a wrong transform moves them by far
  more);
- quantized files against HF loading the same file: Qwen3-MoE through transformers' own GGUF
  reader (Q8_0, experts included); gpt-oss (MXFP4 experts, as released) and Qwen3.5 (Q8_0), which
  transformers cannot read, against HF's model holding exactly the tensors our reader dequantized.
"""

import pytest
import torch

from engine.exec import dummy_weights as dw
from engine.exec.loader import load_model
from engine.exec.models.linear_state import LinearState
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from tests.engine.exec import hybrid_helpers as H
from tests.engine.exec.gguf_write_hybrid import write_gguf

IDS = H.prompt(1, 40)
# what a GGUF can say: Qwen3-MoE files have no mlp_only_layers (every layer routes, as the
# released models do)
GGUF_OVERRIDES = {"qwen3_moe": dict(mlp_only_layers=[])}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PAGED_CHAT_CACHE", str(tmp_path / "cache")
    )  # dequantized copies: this test's


def _engine_logits(loaded, ids):
    m = LlamaModel(
        loaded.config, loaded.weights, torch.float32, "cpu", max_positions=128, lean_step="off"
    )
    if m.spec.linear_layers:
        m.linear_state = LinearState(
            m.spec.linear, len(m.spec.linear_layers), 2, torch.float32, "cpu"
        )
    T, nb = len(ids), -(-len(ids) // 16)
    pool = torch.full((2, m.num_kv_layers, nb, 16, m.num_kv_heads, m.head_dim), float("nan"))
    meta = AttentionMetadata(
        torch.arange(T),
        torch.arange(nb, dtype=torch.int32)[None],
        torch.tensor([T], dtype=torch.int32),
        torch.tensor([0, T], dtype=torch.int32),
        T,
        "torch",
        state_slots=torch.tensor([1]),
    )
    return m.forward(torch.tensor(ids), torch.arange(T), pool, meta, torch.arange(T))


def _model(family):
    """(config, weights, HF's model on them): the family's, as a GGUF can describe it."""
    name, over = H.FAMILIES[family]
    cfg = dw.load_config(name, {**H.SHRINK, **over, **GGUF_OVERRIDES.get(family, {})})
    weights = dw.random_weights(cfg, seed=0)
    return (
        cfg,
        weights,
        (
            dw.hf_model_with_weights(cfg, weights)
            if family in GGUF_OVERRIDES
            else H.hf_model(family)
        ),
    )


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _write(tmp_path, family, quant=None):
    cfg, weights, hf = _model(family)
    path = tmp_path / f"{family}-{quant or 'F32'}.gguf"
    write_gguf(path, cfg, weights, quant=quant)
    return str(path), hf


@pytest.mark.parametrize("family", list(H.FAMILIES))
def test_f32_gguf_equals_the_original_model(tmp_path, family):
    path, hf = _write(tmp_path, family)
    loaded = load_model(path)
    assert loaded.config.model_type == H.config(family).model_type
    ours = _engine_logits(loaded, IDS)
    ref = _hf_logits(hf, IDS)
    assert (ours - ref).abs().max().item() < 1e-4
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("Paged attention")) == "Paged attention"


@pytest.mark.parametrize(
    "family,quant",
    [("qwen3_moe", "Q8_0"), ("gpt_oss", "MXFP4"), ("qwen3_5", "Q8_0"), ("qwen3_5_moe", "Q8_0")],
)
def test_quantized_gguf_equals_hf_loading_it(tmp_path, family, quant):
    path, original = _write(tmp_path, family, quant)
    loaded = load_model(path)
    ours = _engine_logits(loaded, IDS)
    if family == "gpt_oss":  # transformers cannot read its experts: HF on what ours read
        hf = dw.hf_model_with_weights(loaded.config, loaded.weights)
    else:  # transformers reads these files itself (the config completed:
        import os  # engine/exec/gguf_families.py)

        from transformers import AutoConfig, AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path),
            gguf_file=os.path.basename(path),
            config=AutoConfig.from_pretrained(loaded.hf_folder),
            dtype=torch.float32,
        )
    ref = _hf_logits(hf, IDS)
    assert (ours - ref).abs().max().item() < 1e-4
    # the quantized file is not the F32 model (so the comparison above is not vacuous)
    assert (ref - _hf_logits(original, IDS)).abs().max().item() > 1e-4
