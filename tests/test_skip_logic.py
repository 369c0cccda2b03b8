"""The GPU-machine skip rule (tests/deps.py): skip only when a dependency is absent AND CUDA is
present. Checked on the real test files, and end to end by running pytest as the GPU machine would
collect (PAGED_CHAT_ASSUME_CUDA / PAGED_CHAT_ASSUME_MISSING simulate it)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import deps

TESTS = Path(__file__).parent
REPO = TESTS.parent


def test_needs_are_read_from_the_source():
    assert deps.needs("import gradio as gr\n") == ["gradio"]
    assert deps.needs("from storage.store import Store\nfrom ui import chat\n") == [
        "gradio",
        "sqlite_utils",
    ]
    assert deps.needs("from playwright.sync_api import sync_playwright\n") == ["browser"]
    assert deps.needs('subprocess.run([sys.executable, "-m", "bench", "--quick"])') == [
        "bundled model"
    ]
    assert deps.needs("import torch\nimport kernels\nfrom engine import LLM\n") == []


def test_never_skips_without_cuda():
    for f in TESTS.rglob("test_*.py"):
        assert deps.skip_reason(f.read_text(), cuda=False, have=lambda d: False) is None, f


def test_on_a_gpu_machine_only_dependent_modules_skip():
    none = lambda d: False
    src = lambda rel: (TESTS / rel).read_text()
    assert "gradio" in deps.skip_reason(src("ui/test_dashboard_kvmath.py"), cuda=True, have=none)
    assert "browser" in deps.skip_reason(src("e2e/test_chat_browser.py"), cuda=True, have=none)
    assert "sqlite_utils" in deps.skip_reason(
        src("storage/test_storage_schema.py"), cuda=True, have=none
    )
    for rel in (
        "kernels/test_attention.py",
        "kernels/test_fused.py",
        "engine/exec/test_dummy_weights.py",
        "engine/kv/test_block_pool.py",
        "engine/kv/test_kv_cache_manager.py",
    ):
        assert deps.skip_reason(src(rel), cuda=True, have=none) is None, rel
    assert (
        deps.skip_reason(src("ui/test_dashboard_kvmath.py"), cuda=True, have=lambda d: True) is None
    )
    assert (
        deps.bundled_model_skip_reason(True, have=none)
        and deps.bundled_model_skip_reason(False, have=none) is None
    )


def _pytest(*args, **env):
    e = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=e,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_collection_on_a_simulated_gpu_machine_reports_skips_with_reasons():
    # one pytest child (each costs ~4 s of imports): two modules skipped for a package, one test for the model
    r = _pytest(
        "tests/ui/test_dashboard_kvmath.py",
        "tests/storage",
        "tests/engine/kv/test_block_pool.py",
        "tests/engine/exec/test_model_families.py::test_gguf_path_is_dequantized_once_and_cached",
        PAGED_CHAT_ASSUME_CUDA="1",
        PAGED_CHAT_ASSUME_MISSING="gradio,sqlite_utils,bundled model",
    )
    out = r.stdout
    assert r.returncode == 0, out[-2000:]
    assert "needs gradio" in out and "needs sqlite_utils" in out and "3 skipped" in out, out[-2000:]
    assert re.search(
        r"SKIPPED \[1\] tests/engine/exec/test_model_families.py.*bundled model", out
    ), out[-2000:]
    assert "passed" in out  # the engine's own tests still ran


def test_a_package_whose_conftest_needs_a_missing_dependency_is_skipped_unimported():
    """On the GPU machine tests/storage/conftest.py would fail to import sqlite_utils: collecting the
    tree must report that directory as skipped without importing its conftest."""
    import shutil

    root = TESTS / f"_skipcheck_{os.getpid()}"
    d = root / "needs_gguf"
    d.mkdir(parents=True)
    try:
        (d / "conftest.py").write_text("import gguf\nraise RuntimeError('conftest was imported')\n")
        (d / "test_x.py").write_text("def test_x():\n    pass\n")
        (root / "test_y.py").write_text("def test_y():\n    pass\n")
        rel = str(root.relative_to(REPO))
        r = _pytest(rel, PAGED_CHAT_ASSUME_CUDA="1", PAGED_CHAT_ASSUME_MISSING="gguf")
        assert (
            r.returncode == 0 and "needs gguf" in r.stdout and "1 passed, 1 skipped" in r.stdout
        ), r.stdout[-2000:]
        import torch

        if not torch.cuda.is_available():
            r = _pytest(rel)  # no CUDA: it is collected, and fails loudly
            assert r.returncode != 0 and "conftest was imported" in r.stdout + r.stderr
    finally:
        shutil.rmtree(root)
