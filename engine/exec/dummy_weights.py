"""Models without weight files: a config (shipped JSON, config.json or a folder) + seeded random weights.

Why: GPU checks and benchmarks need realistic shapes (Llama-3.2-1B, Qwen2.5-0.5B, Llama-3-8B) on a
machine where multi-GB checkpoints cannot travel. The weights are drawn on the target device in a
fixed order from one seeded generator, so a run is repeatable, and HF transformers can be given the
very same tensors (`hf_model_with_weights`) to serve as the numerical reference.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).with_name("configs")


def shipped_configs() -> list[str]:
    """Names usable as `LLM(model=<name>, load_format="dummy")`, e.g. "llama-3.2-1b"."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def config_path(model: str) -> Path:
    """A shipped name, a config.json file, or a folder holding config.json."""
    if model in shipped_configs():
        return CONFIG_DIR / f"{model}.json"
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"dummy model {model!r}: no such config file or folder with config.json; shipped "
            f"configs: {', '.join(shipped_configs())}"
        )
    return p


def load_config(model: str, overrides: dict | None = None):
    """A transformers config from JSON, with overrides (e.g. {"num_hidden_layers": 2})."""
    from transformers import AutoConfig

    d = json.loads(config_path(model).read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d.update(overrides or {})
    if "model_type" not in d:
        raise ValueError(f"{model}: config has no model_type")
    return AutoConfig.for_model(**d)


def _param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the HF model, taken from a meta-device instance (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    return shapes


def random_weights(config, seed: int = 0, device="cpu", dtype=torch.float32) -> dict:
    """Seeded random weights with HF names. Linear/embedding ~ N(0, initializer_range); norm weights
    ~ 1 + N(0, 0.1) and biases ~ N(0, 0.02) so that neither is a no-op a wrong kernel could hide behind.
    Drawn in fp32 on `device`, then cast: the same seed and device give the same tensors."""
    device = torch.device(device)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in _param_shapes(config).items():
        t = torch.empty(shape, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t.normal_(1.0, 0.1, generator=gen)
        elif name.endswith(".bias"):
            t.normal_(0.0, 0.02, generator=gen)
        else:
            t.normal_(0.0, std, generator=gen)
        out[name] = t.to(dtype)
    return out


def hf_model_with_weights(config, weights: dict, dtype=torch.float32, device="cpu"):
    """HF transformers' own model of `config` holding exactly `weights` (the reference forward)."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            no_init_weights = contextlib.nullcontext
    # no random init: every parameter is overwritten below (for llama-3-8b's two layers HF's own
    # init drew ~0.5 G random numbers, ~7 s here); buffers (RoPE inv_freq) are still built by HF
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # assign: the model holds these very tensors (no second copy of an 8B layer's ~2 GB); nothing
    # writes to them, and the ones already in `dtype` on `device` are the caller's own
    state = {k: v.to(device=device, dtype=dtype).contiguous() for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [m for m in missing if not (m == "lm_head.weight" and tied)]
    if missing or unexpected:
        raise ValueError(
            f"weights do not fit the config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    if tied:
        model.tie_weights()
    return model.eval()


class TokenIdTokenizer:
    """Stands in when a dummy model has no tokenizer: prompts must be token ids; text output is empty."""

    eos_token_id = None
    pad_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text, add_special_tokens=True):
        raise ValueError(
            "this model was loaded without a tokenizer (load_format='dummy'): "
            "send token ids ({'prompt_token_ids': [...]}) instead of text"
        )

    def decode(self, ids, skip_special_tokens=True):
        return ""

    def apply_chat_template(self, *a, **kw):
        self.encode("")

    def __len__(self):
        return self.vocab_size


def load_tokenizer_if_any(model: str):
    """The tokenizer next to the config, or None (a shipped name or a bare config.json has none)."""
    p = config_path(model).parent
    if p == CONFIG_DIR or not any(
        (p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p))
