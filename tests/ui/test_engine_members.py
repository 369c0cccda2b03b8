"""Every member ui/, routes/, backends/ and server/ touch on the engine is declared by a Protocol
(engine/protocol.py).

Why a walk of the source: a Protocol only says what an engine must have; nothing stopped a page
from calling `llm.engine.scheduler...` or `ctx.llm._snapshots` past it, and a remote engine or
the fake would then break at run time. The engine object is whatever these packages call it:
a name `llm` / `engine`, or an attribute `.llm` / `._llm` / `.engine` (`ctx.llm`, `self._llm`,
`srv.llm`, `self.engine`). Reading a member (`llm.x`, `llm.x()`, `getattr(llm, "x")`) counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

from engine.protocol import declared_members

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ui", "routes", "backends", "server")
ENGINE_NAMES = {"llm", "_llm", "engine"}


def _is_engine(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ENGINE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in ENGINE_NAMES


def members_used(source: str) -> list[tuple[int, str]]:
    """(line, member) for every member read on an engine object in `source`."""
    tree = ast.parse(source)
    modules = {
        a.asname or a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
    }  # `import engine` makes `engine.x` a module, not the object
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_engine(node.value):
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                continue
            out.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and _is_engine(node.args[0])
            and isinstance(node.args[1], ast.Constant)
        ):
            out.append((node.lineno, str(node.args[1].value)))
    return sorted(out)


def undeclared(paths) -> list[str]:
    known = declared_members()
    bad = []
    for path in paths:
        for line, member in members_used(path.read_text()):
            if member not in known:
                bad.append(f"{path.relative_to(ROOT)}:{line}: .{member} is declared by no Protocol")
    return bad


def product_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_every_engine_member_used_is_declared_by_a_protocol():
    bad = undeclared(product_files())
    assert not bad, (
        "engine members used but declared by no Protocol (engine/protocol.py):\n" + "\n".join(bad)
    )


def test_the_walk_sees_the_engine_under_each_name():
    """Not vacuous: each way the product names the engine is seen somewhere."""
    seen = {m for p in product_files() for _, m in members_used(p.read_text())}
    assert {
        "submit_chat",
        "latest_snapshot",
        "model_info",
        "metrics_text",
        "queue_position",
        "compile_structured",
        "submit_beam_search",
        "pin_system_prompt",
    } <= seen


def test_the_check_fails_on_a_member_no_protocol_declares(tmp_path):
    """A mutant page reaching past the Protocols is reported, line by line; a module named
    `engine` (an import) is not the engine object."""
    page = tmp_path / "page.py"
    page.write_text(
        "import engine\n"
        "def f(ctx, llm):\n"
        "    ctx.llm.engine.scheduler.waiting\n"  # .engine on the engine object
        "    llm._snapshots.max_wait_s = 1\n"
        "    getattr(self._llm, 'kv_stats', None)\n"
        "    return llm.latest_snapshot(), engine.LLM\n"
    )
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        bad = sorted(undeclared([page]))
    finally:
        ROOT = old
    assert bad == [
        "page.py:3: .engine is declared by no Protocol",
        "page.py:3: .scheduler is declared by no Protocol",
        "page.py:4: ._snapshots is declared by no Protocol",
        "page.py:5: .kv_stats is declared by no Protocol",
    ]
