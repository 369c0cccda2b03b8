"""Block-level columns of a KV snapshot (engine/observe/kv_contract.py): per-block state, ref_count and
filled as lazily built lists or a run-length form, and block tables as id ranges.

Why a module of its own: these are the parts whose cost grows with the pool (350k blocks on an
H200), so they are built from raw C-array copies with numpy, on the reader's thread, and only
when asked for; kv_contract.py keeps the contract's shape and JSON.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

import numpy as np


@contextmanager
def _no_gc():
    """Pause the cyclic GC while building many small containers (owners' 250k one-element lists):
    each allocation burst would otherwise trigger collections that walk every tracked object of
    the process (the pool's Block objects included), which measured 2-6x the build itself here.
    Nothing built here forms cycles, so nothing is lost by collecting afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


STATES = ("free", "used", "cached", "pinned")  # index = the state's code in `block_runs`
_STATE_OBJ = np.array(STATES, dtype=object)  # code -> the very str objects (tolist is cheap)
_CODE = {name: k for k, name in enumerate(STATES)}


class BlockArrays:
    """Per block, index = block id: state "pinned" / "used" / "cached" / "free", ref_count, tokens
    filled, and the KV cache group its content belongs to (engine/kv/cache_spec.py; all 0 for a
    model with one group). "pinned" = held by an app pin (possibly also by chats; ref_count says
    how many).

    Two ways in: from lists (`BlockArrays(state, ref_count, filled)`, what from_json does), or
    from the pool's raw columns (`from_columns`, what the manager does on the engine thread: three
    array copies, no per-block Python work). In the second case the lists are built on first
    use, on the reader's thread, with numpy (about 10 ms for 350k blocks instead of a Python loop
    over every block). Treat the lists as read-only: one snapshot may be shared by many viewers.
    """

    __slots__ = ("_state", "_ref", "_filled", "_group", "_group_col", "_cols", "_codes", "_lock")

    def __init__(self, state, ref_count, filled, group=None):
        self._state, self._ref, self._filled = state, ref_count, filled
        self._group = group  # list, or None: every block in group 0
        self._group_col = None  # array("b") from the pool (from_columns)
        self._cols = self._codes = None
        self._lock = threading.Lock()

    @classmethod
    def from_columns(
        cls, ref_counts, filled_counts, hashed, pinned_ids=(), groups=None
    ) -> "BlockArrays":
        """ref_counts / filled_counts: array("i"), hashed: array("b") (block_pool.BlockPool.columns()),
        copies owned by this snapshot; pinned_ids: ids held by an app pin; groups: array("b") of
        each block's KV cache group, or None for a pool of one group."""
        out = cls(None, None, None)
        out._cols = (ref_counts, filled_counts, hashed, tuple(pinned_ids))
        out._group_col = groups
        return out

    def _groups_np(self, n: int) -> np.ndarray:
        if self._group_col is not None and len(self._group_col):
            return np.frombuffer(self._group_col, dtype=np.int8)
        if self._group is not None:
            return np.asarray(self._group, dtype=np.int8)
        return np.zeros(n, np.int8)

    @property
    def group(self) -> list:
        """The KV cache group of each block (0 everywhere for one group)."""
        if self._group is None:
            with self._lock:
                if self._group is None:
                    self._group = self._groups_np(len(self)).tolist()
        return self._group

    # ---- numpy views (cheap; the reader's thread) -------------------------------------------
    def _np(self):
        """(codes int8, ref_count int32, filled int32) as numpy arrays."""
        with self._lock:
            if self._codes is None:
                if self._cols is not None:
                    ref, filled, hashed, pinned = self._cols
                    r = np.frombuffer(ref, dtype=np.intc) if len(ref) else np.zeros(0, np.intc)
                    f = (
                        np.frombuffer(filled, dtype=np.intc)
                        if len(filled)
                        else np.zeros(0, np.intc)
                    )
                    h = (
                        np.frombuffer(hashed, dtype=np.int8)
                        if len(hashed)
                        else np.zeros(0, np.int8)
                    )
                    codes = np.where(
                        r > 0, np.int8(1), np.where(h != 0, np.int8(2), np.int8(0))
                    ).astype(np.int8)
                    if pinned:
                        codes[np.fromiter(pinned, dtype=np.int64, count=len(pinned))] = 3
                else:
                    codes = np.fromiter(
                        (_CODE[x] for x in self._state), dtype=np.int8, count=len(self._state)
                    )
                    r = np.asarray(self._ref, dtype=np.intc)
                    f = np.asarray(self._filled, dtype=np.intc)
                self._codes = (codes, r, f)
            return self._codes

    def _lists(self):
        if self._state is None:
            codes, r, f = self._np()
            with self._lock, _no_gc():
                if self._state is None:
                    self._ref, self._filled = r.tolist(), f.tolist()
                    self._state = _STATE_OBJ[codes].tolist()
        return self._state, self._ref, self._filled

    state = property(lambda self: self._lists()[0])
    ref_count = property(lambda self: self._lists()[1])
    filled = property(lambda self: self._lists()[2])

    def runs(self) -> dict:
        """Run-length form (v4 "block_runs"): maximal runs of consecutive block ids with equal
        (state, ref_count, filled), as parallel lists. A pool filled by whole sequences is a few
        runs per sequence plus one per free gap, so its size follows the live tables, not the pool."""
        codes, r, f = self._np()
        n = len(codes)
        if n == 0:
            return {
                "states": list(STATES),
                "start": [],
                "length": [],
                "state": [],
                "ref_count": [],
                "filled": [],
                "group": [],
            }
        g = self._groups_np(n)
        cut = (
            np.flatnonzero(
                (codes[1:] != codes[:-1])
                | (r[1:] != r[:-1])
                | (f[1:] != f[:-1])
                | (g[1:] != g[:-1])
            )
            + 1
        )
        start = np.concatenate(([0], cut))
        length = np.diff(np.concatenate((start, [n])))
        return {
            "states": list(STATES),
            "start": start.tolist(),
            "length": length.tolist(),
            "state": codes[start].tolist(),
            "ref_count": r[start].tolist(),
            "filled": f[start].tolist(),
            "group": g[start].tolist(),
        }

    @classmethod
    def from_runs(cls, runs: dict) -> "BlockArrays":
        """The inverse of runs() (reads a compact snapshot)."""
        names = runs.get("states", STATES)
        state, ref, filled, group = [], [], [], []
        groups = runs.get("group") or [0] * len(runs["start"])
        for s, n, c, r, f, g in zip(
            runs["start"], runs["length"], runs["state"], runs["ref_count"], runs["filled"], groups
        ):
            state += [names[c]] * n
            ref += [r] * n
            filled += [f] * n
            group += [g] * n
        return cls(state, ref, filled, group)

    def __eq__(self, other):
        if not isinstance(other, BlockArrays):
            return NotImplemented
        return self._lists() == other._lists() and self.group == other.group

    __hash__ = None

    def __reduce__(
        self,
    ):  # copy / deepcopy / pickle: the materialized lists (a Lock cannot be copied)
        return (BlockArrays, self._lists() + (self.group,))

    def __len__(self) -> int:
        return len(self._cols[0]) if self._state is None else len(self._state)

    def __repr__(self) -> str:
        return f"BlockArrays({len(self)} blocks)"


def id_ranges(ids) -> list:
    """A block table as [[first id, count], ...] runs of consecutive ids (the compact form's
    "block_ranges"): tables allocated from a fresh or freed-in-order pool are a few runs each."""
    a = np.asarray(ids, dtype=np.int64)
    if not len(a):
        return []
    start = np.concatenate(([0], np.flatnonzero(np.diff(a) != 1) + 1))
    count = np.diff(np.concatenate((start, [len(a)])))
    return np.stack([a[start], count], axis=1).tolist()


def expand_ranges(ranges) -> list:
    """The inverse of id_ranges."""
    out = []
    for first, count in ranges:
        out.extend(range(first, first + count))
    return out
