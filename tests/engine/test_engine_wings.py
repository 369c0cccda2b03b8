"""The engine's wings and the one way their imports may run (docs/DESIGN.md, "The engine's wings").

Why a test: a flat folder of 33 modules hid which part owns what; the wings make it visible, and
an import that runs back up (the KV memory importing the engine loop, the runner importing the
front) is how a layering quietly rots. Every import counts, lazy ones and `TYPE_CHECKING` ones
included: a type that needs an upward import is a sign the type lives in the wrong wing.

Floors, top to bottom; a module may import its own wing and any wing on a lower floor, never one on
its own floor or above. `engine/__init__.py` is the public face (it may name anything, lazily).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.import_walk import find_cycles, imports_of
from tests.import_walk import module_name as walk_module_name

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"

FLOORS = {
    "front": 6,  # LLM: the thread-safe public face, request streams, pin calls
    "core": 5,  # the engine loop, scheduler and policies, sequences, sessions, beam search
    "exec": 4,  # model runner, step inputs, CUDA graphs, warm-up, models, loader, weights
    "kv": 3,  # block pool, KV manager, salts, pins, the second tier
    "sampling": 3,  # sampling params, the vectorized sampler, grammar masks
    "observe": 2,  # the typed snapshot / stats contract, the snapshot cache
    "text": 2,  # chat tokens (one safe path), detokenizer, session prompts
    "base": 1,  # errors, config, outputs, protocol: shared by every wing
}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "engine":
        return None
    if len(parts) == 1:
        return "face"
    return parts[1] if parts[1] in FLOORS else "base"


def engine_imports(path: Path) -> list[tuple[int, str]]:
    """Every `engine...` module this file imports (`from engine.x import y` also counts engine.x.y
    when y is a module, e.g. `from engine.exec import dummy_weights`): the shared walker."""
    return imports_of(path, ROOT, {"engine"})


def module_name(path: Path) -> str:
    return walk_module_name(path, ROOT)


def violations() -> list[str]:
    bad = []
    for path in sorted(ENGINE.rglob("*.py")):
        me = module_name(path)
        mine = wing_of(me)
        if mine == "face":
            continue
        for line, target in engine_imports(path):
            theirs = wing_of(target)
            if theirs == "face":
                bad.append(
                    f"{me}:{line} imports the package face `{target}` (import the module itself)"
                )
            elif theirs != mine and FLOORS[theirs] >= FLOORS[mine]:
                bad.append(
                    f"{me}:{line} ({mine}) imports {target} ({theirs}): "
                    f"{'sideways' if FLOORS[theirs] == FLOORS[mine] else 'upward'}"
                )
    return bad


def module_cycles() -> list[list[str]]:
    """Cycles between engine modules (each wing's files too, not only between wings)."""
    graph: dict[str, set[str]] = {}
    for path in ENGINE.rglob("*.py"):
        me = module_name(path)
        graph[me] = {t for _, t in engine_imports(path) if t != me and wing_of(t) != "face"}
    return find_cycles(graph)


def test_every_engine_module_lives_in_a_wing():
    loose = [
        p.name
        for p in ENGINE.glob("*.py")
        if p.stem not in ("__init__", "errors", "config", "outputs", "protocol", "step_plan")
    ]
    assert not loose, (
        f"engine/ top level holds only the face and the base modules; move {loose} into a wing"
    )


def test_imports_run_down_the_floors_only():
    bad = violations()
    assert not bad, "imports that run up or sideways between the engine's wings:\n" + "\n".join(bad)


# Value types execution may take from the KV wing (issue 46): execution reads a step's plan
# (engine/step_plan.py), never the manager, so that memory management can change under it.
EXEC_MAY_IMPORT_FROM_KV: frozenset[str] = frozenset({"engine.kv.cache_spec"})  # KV cache groups


def exec_kv_imports() -> list[str]:
    bad = []
    for path in sorted((ENGINE / "exec").rglob("*.py")):
        for line, target in engine_imports(path):
            if wing_of(target) == "kv" and target not in EXEC_MAY_IMPORT_FROM_KV:
                bad.append(f"{module_name(path)}:{line} imports {target}")
    return bad


def test_execution_takes_only_value_types_from_the_kv_wing():
    bad = exec_kv_imports()
    assert not bad, "engine/exec reads the step plan, not the KV manager:\n" + "\n".join(bad)


def test_execution_and_the_loop_read_the_plan_not_the_manager():
    """The step's block tables and slots are filled once, by the scheduler, into the StepPlan;
    no one in the loop or in execution asks the manager for them again, and logits rows are
    named (LogitsRow), never told apart by type."""
    pattern = re.compile(r"kv\.(block_table|slots_for)\(|isinstance\(r, int\)")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for wing in ("exec", "core")
        for p in sorted((ENGINE / wing).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


def test_no_import_cycle_inside_the_engine():
    cycles = module_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The rule must be able to fail: a KV module importing the engine loop is reported."""
    fake = tmp_path / "engine" / "kv"
    fake.mkdir(parents=True)
    (tmp_path / "engine" / "core").mkdir()
    (tmp_path / "engine" / "core" / "llm_engine.py").write_text("")
    (fake / "bad.py").write_text("from engine.core.llm_engine import LLMEngine\n")
    (tmp_path / "engine" / "core" / "a.py").write_text("import engine.core.b\n")
    (tmp_path / "engine" / "core" / "b.py").write_text("from engine.core import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ENGINE", tmp_path / "engine")
    assert any("engine.kv.bad" in v and "upward" in v for v in violations())
    (tmp_path / "engine" / "exec").mkdir()
    (tmp_path / "engine" / "exec" / "runner.py").write_text(
        "from engine.kv import kv_cache_manager\n"
    )
    assert any("engine.exec.runner" in v for v in exec_kv_imports())
    assert any("engine.core.a" in c and "engine.core.b" in c for c in module_cycles())
