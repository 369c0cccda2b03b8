"""The engine with attention_backend="triton" (interpreted on CPU) gives the torch backend's tokens."""

import os

import pytest

from engine import SamplingParams


@pytest.mark.slow
def test_triton_backend_matches_torch_backend_greedy(make_llm):
    assert os.environ.get("TRITON_INTERPRET") == "1" or __import__("torch").cuda.is_available()
    chat = [{"role": "user", "content": "Say hi."}]
    p = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    torch_llm = make_llm(num_blocks=32, attention_backend="torch")
    ref = torch_llm.chat(chat, p)[0]
    triton_llm = make_llm(num_blocks=32, attention_backend="triton")
    assert triton_llm.model_info().attention_backend == "triton"
    out = triton_llm.chat(chat, p)[0]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
