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
from _pytest.reports import CollectReport  # noqa: E402

from tests import deps  # noqa: E402

_CUDA = torch.cuda.is_available() or deps.ASSUME_CUDA


def _reason_for(paths) -> str | None:
    if not _CUDA:
        return None
    paths = [p for p in paths if p.exists()]
    if not paths:
        return None
    return deps.skip_reason("\n".join(p.read_text(errors="replace") for p in paths), _CUDA)


class _GpuMachineSkips:
    """Registered as a plain plugin (pytest_configure below), not as this conftest's hook: a
    conftest's hooks are not active for a directory until that directory's own conftests are
    loaded, which is exactly the import that must not happen."""

    @staticmethod
    @pytest.hookimpl(tryfirst=True)
    def pytest_make_collect_report(collector):
        """On a CUDA machine without gradio / gguf / sqlite-utils / a browser / the bundled model, a test
        module needing one, or a directory whose conftest needs one (that conftest is then never
        imported), is reported as skipped with the reason instead of failing at import.
        On CPU this never triggers (see tests/deps.py)."""
        path = getattr(collector, "path", None)
        if path is None:
            return None
        if isinstance(collector, pytest.Directory):
            reason = _reason_for([path / "conftest.py"])
        elif isinstance(collector, pytest.Module):
            reason = _reason_for([path])
        else:
            return None
        if reason is None:
            return None
        return CollectReport(collector.nodeid, "skipped", (str(path), 0, f"Skipped: {reason}"), [])


def pytest_configure(config):
    if _CUDA:
        config.pluginmanager.register(_GpuMachineSkips(), "paged-chat-gpu-machine-skips")


@pytest.fixture(scope="session")
def model_folder() -> str:
    """A plain HF folder of the default model (GGUF dequantized once into the cache)."""
    reason = deps.bundled_model_skip_reason(_CUDA)
    if reason:
        pytest.skip(reason)
    from engine.exec.loader import resolve_hf_folder
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


_MODULES_BETWEEN_FULL_COLLECTIONS = 8
_modules_done = [0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a module (its module fixtures are finalized by then): collect, and hand
    freed heap memory back to the OS. Without this a worker's RSS only grows (glibc keeps freed
    arenas), ~9 GB by the end of the suite, and two workers plus app processes and Chromium came
    close to the 24 GiB of these machines.

    Then freeze what survived (gc.freeze): imported modules, session fixtures, caches, ~500k
    objects that live until the worker exits. Every full collection walked all of them again
    (~0.4 s each, dozens per module: ~14% of the engine tests' time went to the GC); frozen, a
    collection walks only what the next module allocates. Reference counting still frees frozen
    objects, but a cycle among them would stay (measured: ~4 MB a module), so every 8th module
    boundary unfreezes and collects everything once."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        import gc
        _modules_done[0] += 1
        if _modules_done[0] % _MODULES_BETWEEN_FULL_COLLECTIONS == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        _malloc_trim()


def _malloc_trim() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):     # not glibc: nothing to hand back this way
        pass


def pytest_collection_finish(session):
    """Collection imported torch, transformers, gradio and every test module: freeze them before
    the first test (see pytest_runtest_teardown)."""
    import gc
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    import gc
    gc.unfreeze()       # an ordinary interpreter shutdown (extension modules check for leaks then)
