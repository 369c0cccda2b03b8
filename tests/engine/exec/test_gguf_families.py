"""A GGUF per architecture, written here with gguf's writer from the families' tiny random models
(tests/engine/gguf_write.py), loaded by the engine (engine/exec/loader.py: transformers dequantizes,
engine/exec/gguf_families.py completes what it leaves out) and compared with HF transformers:
- quantized files (Q8_0 by gguf-py's quantizer; Q4_K blocks written directly, gguf-py has no K-quant
  quantizer) against HF loading the same file: fp32 logits within 1e-4 on a prompt longer than
  the window, and the engine's greedy tokens;
- SmolLM3 (no transformers mapping: ours) and Phi-4-mini (transformers drops its partial rotary and
  LongRoPE factors: ours puts them back) in F32 against HF on the original weights, the model
  itself: a wrong mapping changes the logits by far more than 1e-4;
- damaged files: a sentence, not a numpy traceback.
"""

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError
from engine.exec import dummy_weights as dw
from engine.exec.loader import load_model
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from tests.engine.gguf_write import write_gguf
from tests.engine.exec.helpers import FAMILIES, SHRINK, A

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
K_SHAPE = dict(hidden_size=256, intermediate_size=256, head_dim=64)  # Q4_K rows: multiples of 256
MODELS = {
    **FAMILIES,
    "llama3": (
        "llama-3.2-1b",
        dict(
            num_hidden_layers=2,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 500000.0,
            },
        ),
    ),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PAGED_CHAT_CACHE", str(tmp_path / "cache")
    )  # dequantized copies: this test's


def _write(tmp_path, family, quant, extra=None):
    name, over = MODELS[family]
    cfg = dw.load_config(name, {**SHRINK, **over, **(extra or {})})
    weights = dw.random_weights(cfg, seed=0)
    path = tmp_path / f"{family}-{quant or 'F32'}.gguf"
    write_gguf(
        path, cfg, weights, specials=SPECIALS, template=TEMPLATE, quant=quant, name=f"tiny {family}"
    )
    return str(path), cfg, weights


def _engine_logits(loaded, ids):
    m = LlamaModel(
        loaded.config, loaded.weights, torch.float32, "cpu", max_positions=128, lean_step="off"
    )
    T = len(ids)
    nb = -(-T // 16)
    pool = torch.full((2, m.num_layers, nb, 16, m.num_kv_heads, m.head_dim), float("nan"))
    meta = AttentionMetadata(
        torch.arange(T),
        torch.arange(nb, dtype=torch.int32)[None],
        torch.tensor([T], dtype=torch.int32),
        torch.tensor([0, T], dtype=torch.int32),
        T,
        "torch",
    )
    return m.forward(torch.tensor(ids), torch.arange(T), pool, meta, torch.arange(T))


def _hf_from_gguf(path, folder):
    """HF loading the same file (with the config our reader completed: the tiny models' head size,
    SmolLM3's registration)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from engine.exec.gguf_families import reader_knows

    with reader_knows("smollm3"):
        return AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path),
            gguf_file=os.path.basename(path),
            config=AutoConfig.from_pretrained(folder),
            dtype=torch.float32,
        )


@pytest.mark.parametrize(
    "family,quant",
    [
        ("qwen3", "Q8_0"),
        ("gemma3", "Q8_0"),
        ("mistral", "Q8_0"),
        ("qwen2-window", "Q8_0"),
        ("llama-yarn", "Q8_0"),
        ("gemma3", "Q4_K"),
        ("smollm3", "Q8_0"),
    ],
)
def test_quantized_gguf_equals_hf_loading_the_same_file(tmp_path, family, quant):
    path, cfg, _ = _write(tmp_path, family, quant, K_SHAPE if quant == "Q4_K" else None)
    loaded = load_model(path)
    assert (
        loaded.config.model_type == cfg.model_type or family == "mistral"
    )  # llama.cpp files Mistral as llama
    assert loaded.tokenizer.chat_template == TEMPLATE
    ours = _engine_logits(loaded, A)
    with torch.no_grad():
        ref = _hf_from_gguf(path, loaded.hf_folder)(torch.tensor([A])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4
    assert ref.std() > 0.05


@pytest.mark.parametrize("family", ["smollm3", "phi4", "llama3"])
def test_f32_gguf_is_the_original_model(tmp_path, family):
    """What transformers cannot read (SmolLM3) or reads wrong (Phi's partial RoPE and LongRoPE
    factors, Llama 3's RoPE scaling stored as rope_freqs): the engine's GGUF model is the HF model of
    the original weights, through the whole engine (greedy) and in fp32 logits."""
    path, cfg, weights = _write(tmp_path, family, None)
    hf = dw.hf_model_with_weights(cfg, weights)
    loaded = load_model(path)
    ours = _engine_logits(loaded, A)
    with torch.no_grad():
        ref = hf(torch.tensor([A])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4
    llm = LLM(model=path, num_blocks=16, device="cpu")
    try:
        out = (
            llm.generate(
                [{"prompt_token_ids": A}],
                SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
            )[0]
            .outputs[0]
            .token_ids
        )
        with torch.no_grad():
            want = hf(torch.tensor([A + out[:-1]])).logits[0, len(A) - 1 :].argmax(-1).tolist()
        assert out == want
        info = llm.model_info()
        assert info.architecture == cfg.architectures[0], info.architecture
    finally:
        llm.shutdown()


def test_damaged_gguf_files_get_a_sentence(tmp_path):
    path, _, _ = _write(tmp_path, "qwen3", None)
    with open(path, "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelLoadError, match="cut short"):
        load_model(str(cut))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"<html>404 not found</html>" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(junk))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:4] + b"\xff" * 60 + data[64:])
    with pytest.raises(ModelLoadError, match="damaged or cut short"):
        load_model(str(bad))


def test_models_that_cannot_be_served_get_a_sentence(tmp_path, monkeypatch):
    """An unknown architecture, a model larger than the memory, a template that cannot render or
    drops the message: ModelLoadError in plain words, before any weight is read."""
    from engine.exec import load_checks
    from tests.engine.family_chat import family_tokenizer

    name, over = FAMILIES["qwen3"]
    cfg = dw.load_config(name, {**SHRINK, **over})
    folder = tmp_path / "m"
    dw.hf_model_with_weights(cfg, dw.random_weights(cfg, seed=0)).save_pretrained(folder)
    tok = family_tokenizer("qwen3")
    tok.save_pretrained(folder)
    assert load_model(str(folder)).config.model_type == "qwen3"
    monkeypatch.setattr(load_checks, "available_memory_bytes", lambda: 100_000)
    with pytest.raises(ModelLoadError, match="too large for this machine.*GiB is available"):
        load_model(str(folder))
    monkeypatch.undo()
    for template, words in (
        ("{{ raise_exception('no system role') }}", "cannot be rendered"),
        ("{% for m in messages %}{{ m['role'] }}{% endfor %}", "leaves the user's message out"),
    ):
        tok.chat_template = template
        tok.save_pretrained(folder)
        with pytest.raises(ModelLoadError, match=words):
            load_model(str(folder))
    import json

    (folder / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ModelLoadError, match="unsupported architecture GPT2LMHeadModel"):
        load_model(str(folder))
