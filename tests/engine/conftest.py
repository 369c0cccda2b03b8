import pytest

from tests.engine import hf_reference


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    hf_reference.set_model(hf_model)
    return hf_reference.hf_greedy


@pytest.fixture(scope="module")
def make_llm():
    """Build engines with small pools; every one is shut down and checked for leaks at the end."""
    from engine import LLM
    made = []

    def make(**kw):
        kw.setdefault("num_blocks", 512)
        kw.setdefault("device", "cpu")       # the references are fp32 HF on CPU, on any machine
        if "model" not in kw:
            from tests import deps
            import torch
            reason = deps.bundled_model_skip_reason(torch.cuda.is_available() or deps.ASSUME_CUDA)
            if reason:
                pytest.skip(reason)
        llm = LLM(**kw)
        made.append(llm)
        return llm
    yield make
    for llm in made:
        try:
            stats = llm.stats()
            assert stats["used_blocks"] == _held_by_sessions(llm), f"leaked blocks: {stats}"
        finally:
            llm.shutdown()


def _held_by_sessions(llm) -> int:
    snap = llm.snapshot()
    held = set()
    for s in snap["sequences"]:
        if s["state"] == "idle_session":
            held.update(s["block_table"])
    return len(held)
