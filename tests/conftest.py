"""Shared fixtures: the real default model (dequantized once and cached) and HF's reference model.

TRITON_INTERPRET must be set before anything imports triton, so it is set here, first.
"""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # see engine/__init__.py: tests share 2 cores

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def model_folder() -> str:
    """A plain HF folder of the default model (GGUF dequantized once into the cache)."""
    from engine.loader import resolve_hf_folder
    return resolve_hf_folder(None)[1]


@pytest.fixture(scope="session")
def hf_model(model_folder):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="session")
def tokenizer(model_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_folder)
