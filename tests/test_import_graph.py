"""The one way imports may run between the top-level packages (docs/DESIGN.md, "The import rule").

Why a test: routes importing the dashboard, the dashboard importing the load generator, the page
assembling the server: each was one convenient import, and together they made the product depend
on its own tools and tied every layer to every other. Every import counts (module level, lazy ones
inside functions, `TYPE_CHECKING` ones), walked by the same helper as the engine's wings
(tests/import_walk.py).

Floors, top to bottom; a package may import its own modules and packages on lower floors only,
never one on its own floor (sideways) or above. loadgen/ and bench/ are tools: they may import
anything, and nothing in the product imports them.
"""

from __future__ import annotations

from pathlib import Path

from tests.import_walk import find_cycles, imports_of, module_name

ROOT = Path(__file__).resolve().parents[1]

FLOORS = {
    "app": 7,  # flags -> engine, storage -> server
    "server": 6,  # assembles the FastAPI app: routes, security, exports, pins, the page
    "ui": 5,  # pages only (chat, dashboard)
    "routes": 5,  # /v1, /metrics, /api/kv, login, security middleware
    "backends": 4,  # the ChatEngine face over a remote OpenAI-compatible server
    "storage": 4,  # SQLite history, exports
    "engine": 2,  # the engine (its wings: tests/engine/test_engine_wings.py)
    "kernels": 1,  # attention / KV kernels
}
TOOLS = ("loadgen", "bench")
PACKAGES = (*FLOORS, *TOOLS)


def files() -> list[Path]:
    out = [ROOT / "app.py"] if (ROOT / "app.py").exists() else []
    for pkg in PACKAGES:
        if (ROOT / pkg).is_dir():
            out += sorted((ROOT / pkg).rglob("*.py"))
    return out


def top_of(module: str) -> str:
    return module.split(".")[0]


def arrows() -> list[tuple[str, int, str]]:
    """(importing module, line, imported module) for every import between two top-level packages."""
    out = []
    for path in files():
        me = module_name(path, ROOT)
        out += [
            (me, line, target)
            for line, target in imports_of(path, ROOT, set(PACKAGES))
            if top_of(target) != top_of(me)
        ]
    return out


def violations() -> list[str]:
    bad = []
    for me, line, target in arrows():
        mine, theirs = top_of(me), top_of(target)
        if theirs in TOOLS:
            if mine not in TOOLS:
                bad.append(
                    f"{me}:{line} imports the tool {target} (the product never imports loadgen/bench)"
                )
        elif mine in TOOLS:
            continue
        elif FLOORS[theirs] >= FLOORS[mine]:
            bad.append(
                f"{me}:{line} ({mine}) imports {target} ({theirs}): "
                f"{'sideways' if FLOORS[theirs] == FLOORS[mine] else 'upward'}"
            )
    return bad


def package_cycles() -> list[list[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for me, _, target in arrows():
        graph.setdefault(top_of(me), set()).add(top_of(target))
    return find_cycles(graph)


def test_every_product_package_has_a_floor():
    here = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert here - set(PACKAGES) <= {"tests", "scripts"}, (
        f"give {here - set(PACKAGES)} a floor in FLOORS"
    )


def test_imports_run_down_the_floors_only():
    bad = violations()
    assert not bad, "imports that run up or sideways between top-level packages:\n" + "\n".join(bad)


def test_no_import_cycle_between_top_level_packages():
    cycles = package_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_walker_sees_the_known_arrows():
    """The walk is not vacuous: it sees lazy imports (server.__init__'s), module-level ones, and
    the downward arrows the product is built on."""
    pairs = {(top_of(me), top_of(t)) for me, _, t in arrows()}
    assert {
        ("app", "server"),
        ("server", "ui"),
        ("server", "routes"),
        ("ui", "engine"),
        ("routes", "engine"),
        ("engine", "kernels"),
        ("ui", "backends"),
        ("loadgen", "ui"),
    } <= pairs
    lazy = imports_of(ROOT / "server" / "__init__.py", ROOT, {"server"})  # inside functions
    assert {t for _, t in lazy} >= {"server.assembly", "server.run"}


def test_the_checker_fails_on_upward_sideways_tool_imports_and_cycles(tmp_path, monkeypatch):
    """The rule must be able to fail: routes importing the page (sideways), the engine importing
    storage (upward, lazily inside a function), the dashboard importing loadgen, a TYPE_CHECKING
    import, and the cycle routes -> storage -> routes are all reported."""
    for pkg in ("routes", "ui", "storage", "engine", "loadgen", "kernels"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "ui" / "page.py").write_text("from loadgen import demo\n")
    (tmp_path / "loadgen" / "demo.py").write_text("import ui.page\n")  # tools may
    (tmp_path / "routes" / "kv.py").write_text("from ui.page import scope\nimport storage.db\n")
    (tmp_path / "engine" / "x.py").write_text("def f():\n    from storage import db\n")
    (tmp_path / "storage" / "db.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from routes import kv\n"
    )
    (tmp_path / "kernels" / "k.py").write_text("from . import k2\n")  # relative, same package
    (tmp_path / "kernels" / "k2.py").write_text("")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    bad = violations()
    assert any(v.startswith("routes.kv:1") and "sideways" in v for v in bad)
    assert any(v.startswith("engine.x:2") and "upward" in v for v in bad)
    assert any(v.startswith("ui.page:1") and "tool" in v for v in bad)
    assert not any(v.startswith("loadgen.") or v.startswith("kernels.") for v in bad)
    assert any("storage.db:3" in v and "upward" in v for v in bad)  # TYPE_CHECKING counts
    cycles = package_cycles()
    assert any(set(c) == {"routes", "storage"} for c in cycles)
