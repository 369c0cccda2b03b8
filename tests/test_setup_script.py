"""scripts/setup.sh keeps an installed torch: a fresh .venv made from a Python that already has torch
uses that torch (no pinned CPU wheel pulled over a CUDA build). Runs the real script on a copy of
the requirements, from this venv's Python (which has torch), with the real pip."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_setup_engine_mode_keeps_the_installed_torch(tmp_path):
    for name in ("requirements.txt", "requirements-engine.txt", "requirements-test.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    py = Path(sys.executable)  # a Python that has torch (CI: .venv; GPU machine: the system's)
    r = subprocess.run(
        ["bash", "scripts/setup.sh", "--engine"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={"PYTHON": str(py), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "keeping installed torch" in r.stdout
    ours = subprocess.run(
        [str(py), "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True
    )
    theirs = subprocess.run(
        [str(tmp_path / ".venv/bin/python"), "-c", "import torch; print(torch.__file__)"],
        capture_output=True,
        text=True,
    )
    assert theirs.stdout == ours.stdout and ours.stdout, theirs.stderr
    assert not list((tmp_path / ".venv").rglob("torch/__init__.py")), "a second torch was installed"


def test_engine_requirements_pin_no_torch_and_need_no_app():
    lines = [
        ln.split("#")[0].strip()
        for ln in (REPO / "requirements-engine.txt").read_text().splitlines()
    ]
    lines = [ln for ln in lines if ln]
    assert not any(ln.startswith("torch==") for ln in lines)
    assert not any(
        ln.split(">")[0].split("=")[0].split("<")[0] in ("gradio", "gguf", "sqlite-utils")
        for ln in lines
    )
    app = {ln.split("#")[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()}
    missing = [ln for ln in lines if not ln.startswith("torch") and ln not in app]
    assert not missing, f"requirements.txt must name every engine requirement as written: {missing}"
    assert "torch==2.13.0" in app  # CPU installs pin torch (unpinned pulls a CUDA build)


def test_pypi_kernels_cannot_shadow_this_repos_kernels():
    """PyPI's `kernels` (required by transformers >= 5.25) has the import name of this repo's kernels/
    package: with it installed, transformers imports ours in its place and every model load fails
    (a fresh install on 2026-12-03 did). The requirements keep transformers below 5.25, setup.sh
    removes a `kernels` an earlier install left, and this environment has none."""
    import importlib.metadata

    from packaging.specifiers import SpecifierSet

    for name in ("requirements.txt", "requirements-engine.txt"):
        line = next(
            ln.split("#")[0].strip()
            for ln in (REPO / name).read_text().splitlines()
            if ln.startswith("transformers")
        )
        spec = SpecifierSet(line[len("transformers") :])
        assert "5.24.0" in spec and "5.25.0" not in spec, (name, line)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("kernels")
