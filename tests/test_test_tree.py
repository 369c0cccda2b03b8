"""The test tree's own rules (issue 46.6): no test module imports another, tests/engine mirrors the
engine's wings, and no two test files share a basename.

Why: a test module imported by another runs its module-level code (hypothesis profiles, `TestCase =
Machine.TestCase` aliases, fixtures) in a second place, and a helper hidden in a test file is found
by nobody; shared code lives in a `helpers.py` (or another non-test module) next to the tests, and
shared fixtures in a conftest.py. pytest imports test files by basename (rootdir "prepend" mode, no
tests/__init__.py), so two test files with one name would collide at collection.
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(path: Path) -> list[str]:
    """The test modules `path` imports, as written (absolute, relative or bare)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and _is_test_module(node.module):
                found.append(module)
            else:  # `from tests.engine import test_x` names the module itself
                found += [
                    f"{module}.{a.name}".lstrip(".") if node.level == 0 else f"{module}{a.name}"
                    for a in node.names
                    if a.name.startswith("test_")
                ]
    return found


def imports_between_test_modules(tests: Path) -> dict[str, list[str]]:
    """{test file: the test modules it imports} over every tests/**/*.py (helpers and conftests
    too: a helper that imports a test module is the same hidden dependency)."""
    out = {}
    for path in sorted(tests.rglob("*.py")):
        hits = imported_test_modules(path)
        if hits:
            out[str(path.relative_to(tests.parent))] = hits
    return out


def test_no_test_module_imports_another():
    bad = imports_between_test_modules(TESTS)
    assert not bad, f"move what they share into a helpers.py (or a conftest.py for fixtures): {bad}"


def test_the_check_sees_every_form_of_import(tmp_path):
    """The rule above can fail: each way of writing the import is caught, helpers are not."""
    (tmp_path / "tests" / "ui").mkdir(parents=True)
    forms = [
        "from tests.ui.test_chat_flow import KW",
        "import tests.ui.test_chat_flow",
        "from tests.ui import test_chat_flow",
        "from test_chat_flow import KW",
        "from .test_chat_flow import KW",
        "from . import test_chat_flow",
        "def f():\n    from tests.kernels.test_attention import build_case",
    ]
    for i, line in enumerate(forms):
        (tmp_path / "tests" / "ui" / f"test_form_{i}.py").write_text(line + "\n")
    (tmp_path / "tests" / "ui" / "test_ok.py").write_text(
        "from tests.ui.helpers import KW\nimport tests.ui.fake_engine\nfrom tests import deps\n"
    )
    bad = imports_between_test_modules(tmp_path / "tests")
    assert sorted(bad) == [f"tests/ui/test_form_{i}.py" for i in range(len(forms))], bad


def test_engine_tests_mirror_the_engines_wings():
    """A test goes where the code it tests lives: every folder under tests/engine is a wing of
    engine/ (docs/DESIGN.md, "The engine's wings"), and every wing has its tests there."""
    wings = {p.parent.name for p in (ROOT / "engine").glob("*/__init__.py")}
    folders = {
        p.name
        for p in (TESTS / "engine").iterdir()
        if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))
    }
    assert folders == wings, (
        f"tests/engine folders {sorted(folders)} vs engine wings {sorted(wings)}"
    )
    for wing in wings:
        assert any((TESTS / "engine" / wing).glob("test_*.py")), f"no tests for engine/{wing}"
    # at the top only what tests no single wing: the wings' import rules, and the HF reference helper
    top = {p.name for p in (TESTS / "engine").glob("test_*.py")}
    assert top == {"test_engine_wings.py", "test_hf_reference.py"}, f"sort into a wing: {top}"


def test_test_file_basenames_are_unique():
    seen = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
