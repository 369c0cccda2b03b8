"""The one import walker of the layering tests (tests/engine/test_engine_wings.py for the engine's
wings, tests/test_import_graph.py for the top-level packages).

Every import counts: module level, lazy ones inside functions, `TYPE_CHECKING` ones. `from a.b import
c` counts `a.b`, and also `a.b.c` when c is a module or package under `root`. Relative imports are
resolved against the importing module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(root: Path, dotted: str) -> bool:
    p = root / dotted.replace(".", "/")
    return p.with_suffix(".py").exists() or p.is_dir()


def imports_of(path: Path, root: Path, tops: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import in `path` whose first name is in `tops` (all when None)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [(node.lineno, mod)] if mod else []
            names += [
                (node.lineno, f"{mod}.{a.name}" if mod else a.name)
                for a in node.names
                if _is_module(root, f"{mod}.{a.name}" if mod else a.name)
            ]
        else:
            continue
        out += [(line, m) for line, m in names if tops is None or m.split(".")[0] in tops]
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles in a directed graph (each found once per back edge), nodes as given."""
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles
