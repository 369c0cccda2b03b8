"""The UI's one fake and the real engine implement the same declared face (engine/protocol.py):
a member the UI starts using must be added to the Protocol, the LLM and the fake together."""
import inspect

from engine import LLM
from engine.protocol import ChatEngine
from tests.ui.fake_engine import FakeLLM

MEMBERS = [m for m in dir(ChatEngine) if not m.startswith("_")]


def test_the_fake_implements_the_protocol():
    assert isinstance(FakeLLM(), ChatEngine)
    assert {"submit_chat", "abort", "end_session", "close_session", "snapshot", "latest_snapshot",
            "model_info", "max_model_len", "count_prompt_tokens", "get_tokenizer"} <= set(MEMBERS)


def test_the_real_llm_has_every_member_with_compatible_signatures():
    for name in MEMBERS:
        assert hasattr(LLM, name), f"engine.LLM lacks {name}"
        proto, real = getattr(ChatEngine, name), getattr(LLM, name)
        if callable(proto) and not isinstance(proto, property):
            want = [p for p in inspect.signature(proto).parameters if p != "self"]
            have = inspect.signature(real).parameters
            assert all(p in have for p in want), f"LLM.{name} lacks parameters {want}"
            fake = inspect.signature(getattr(FakeLLM, name)).parameters
            assert all(p in fake for p in want), f"FakeLLM.{name} lacks parameters {want}"
