"""Shared fixtures: the real default model (dequantized once and cached) and HF's reference model.

TRITON_INTERPRET must be set before anything imports triton, so it is set here, first.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see engine/__init__.py: tests share 2 cores
# Weights and KV pools on 2 MiB pages are fresh mappings, which this process's heap reuse (see
# _keep_freed_memory) cannot serve: hundreds of test engines would each pay for new memory. The
# suite runs on the heap; tests/engine/exec/test_huge_pages.py turns them on where it checks them.
os.environ.setdefault("PAGED_CHAT_HUGE_PAGES", "0")

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
    freed heap memory back to the OS if the worker holds more than TRIM_ABOVE_BYTES (see
    _keep_freed_memory for why not always).

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
        if _rss_bytes() > TRIM_ABOVE_BYTES:
            _libc_call("malloc_trim", 0)


TRIM_ABOVE_BYTES = 6 * 2**30


def _keep_freed_memory() -> None:
    """Let this worker reuse the memory it frees instead of handing it back to the OS at once.

    Why: on these VMs memory a process touches for the first time is slow. The host backs guest
    memory page by page, and free pages are reported back to it (virtio-balloon) within seconds,
    so a page freed and touched again a few seconds later costs as much as a new one: measured,
    1.2-5.7 s of kernel time per GB, against ~0.4 s for a page reused at once. glibc serves each
    allocation above its mmap threshold (128 KB, rising to at most 32 MB) with its own mapping and
    unmaps it when freed, so every engine a test built (weights fused and packed, a KV pool) and
    every big forward paid for fresh memory: a third of the engine tests' CPU was the kernel's.
    Here every allocation comes from the heap and freed memory stays there for the next one
    (five engine test files, serially: 121-165 s before, 98-106 s after; the whole suite 933 ->
    761 s). The heap is trimmed at a module boundary only above TRIM_ABOVE_BYTES (without any
    trim a worker grew to ~9 GB over the suite; two workers, app processes and Chromium share
    24 GiB: at most 17.3 GB in use, one worker at 8.0 GB). Only this process: app processes and
    Chromium keep glibc's defaults."""
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    _libc_call("mallopt", M_MMAP_MAX, 0)
    _libc_call("mallopt", M_TRIM_THRESHOLD, 2**31 - 1)  # mallopt takes a C int


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _libc_call(name: str, *args) -> None:
    try:
        import ctypes

        getattr(ctypes.CDLL("libc.so.6"), name)(*args)
    except (OSError, AttributeError):  # not glibc: nothing to tune this way
        pass


_keep_freed_memory()


def pytest_collection_finish(session):
    """Collection imported torch, transformers, gradio and every test module: freeze them before
    the first test (see pytest_runtest_teardown)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    import gc

    gc.unfreeze()  # an ordinary interpreter shutdown (extension modules check for leaks then)
