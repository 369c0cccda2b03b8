import pytest

from tests.engine import hf_reference


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    hf_reference.set_model(hf_model)
    return hf_reference.hf_greedy


class _Engines:
    """Every engine make_llm built in this module. One built inside a test (or a function-scoped
    fixture) is checked and shut down when that test ends; one built by a module-scoped fixture lives
    until the module ends. Why not all at the module's end: each engine holds ~1.7 GB (weights, packed
    linears, the lean step's copy, the KV pool), and a module building 16 of them held 21 GB at once,
    next to a second worker, app processes and Chromium on a 24 GiB machine."""

    def __init__(self):
        self.made = []

    def finalize(self, keep: int = 0) -> None:
        """Check and shut down every engine after the first `keep` (newest first)."""
        errors = []
        while len(self.made) > keep:
            llm = self.made.pop()
            try:
                stats = llm.stats()
                if stats["used_blocks"] != _held_by_sessions(llm):
                    errors.append(f"leaked blocks: {stats}")
            finally:
                llm.shutdown()
        assert not errors, errors


@pytest.fixture(scope="module")
def _engines():
    engines = _Engines()
    yield engines
    engines.finalize()


@pytest.fixture(autouse=True)
def _engines_built_by_this_test(request):
    """Module fixtures are set up before this (higher scope first), so what exists now is theirs."""
    if "make_llm" not in request.fixturenames:
        yield
        return
    engines = request.getfixturevalue("_engines")
    before = len(engines.made)
    yield
    engines.finalize(keep=before)


@pytest.fixture(scope="module")
def make_llm(_engines):
    """Build engines with small pools; every one is shut down and checked for leaks when the test
    (or, for a module fixture's engine, the module) that built it ends."""
    from engine import ServingLLM

    def make(**kw):
        kw.setdefault("num_blocks", 512)
        kw.setdefault("device", "cpu")  # the references are fp32 HF on CPU, on any machine
        if "model" not in kw:
            from tests import deps
            import torch

            reason = deps.bundled_model_skip_reason(torch.cuda.is_available() or deps.ASSUME_CUDA)
            if reason:
                pytest.skip(reason)
        llm = ServingLLM(**kw)
        _engines.made.append(llm)
        return llm

    return make


def _held_by_sessions(llm) -> int:
    snap = llm.snapshot()
    held = set()
    for s in snap["sequences"]:
        if s["state"] == "idle_session":
            held.update(s["block_table"])
    return len(held)
