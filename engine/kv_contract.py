"""The KV stats and snapshot contract between the engine and everything that watches it (the
dashboard, /metrics, /api/kv, the bench, the tests), as typed values with one JSON form.

Why one module: the contract used to be an untyped dict built in the manager, patched in the
engine and re-derived by hand elsewhere, so a renamed key broke a reader silently. These
dataclasses are its only definition. `to_json()` gives the documented, versioned JSON served at
/api/kv (see docs/DESIGN.md, "KV contract"); readers use that dict or the objects themselves.

Scale: blocks are parallel arrays (one list per field, index = block id), not one object per
block. The engine thread only copies raw columns (the pool's C arrays, one array("i") per block
table): well under a millisecond of memcpy plus O(live sequences) for a 350k-block pool. Lists,
`shared` flags, block states and `owners` are derived lazily on the reader's thread with numpy
(BlockArrays, LazySequenceViews). A snapshot is taken on demand (between engine steps), never
periodically on the engine thread.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

SCHEMA = "paged-chat.kv"
VERSION = 4          # 1: the untyped dict before issue 10; 2: this module (adds "schema", "version");
                     # 3: block state "pinned", "pins", stats pinned_blocks / max_pinned_blocks;
                     # 4: "block_runs" (run-length block states), to_json(compact=True) without
                     #    "blocks"/"owners"; every v3 field is still produced by default


@dataclass(frozen=True)
class KVStats:
    """Counters: the manager's (pool, prefix cache, sharing) plus the engine's (scheduler)."""
    block_size: int
    total_blocks: int
    free_blocks: int
    used_blocks: int
    cached_blocks: int            # free but still holding a prefix-cache hash (revivable)
    shared_blocks: int            # ref_count >= 2
    peak_used_blocks: int
    logical_blocks: int           # sum of every live table's length (what no sharing would use)
    kv_bytes_per_token: int
    kv_bytes_per_block: int
    kv_capacity_tokens: int
    used_tokens: int
    prefix_cache_queries: int     # tokens looked up
    prefix_cache_hits: int        # tokens found
    num_preemptions: int
    savings_vs_unshared: float    # 1 - chat_used_blocks / logical
    savings_vs_contiguous: float  # 1 - chat_used_blocks / (live sequences x max_model_len blocks)
    num_sequences: int
    num_idle_sessions: int        # parked sessions holding blocks between turns
    internal_fragmentation_tokens: int
    usage: float                  # used / total, 0..1
    # engine-level (0 when read from a bare manager)
    running: int = 0
    waiting: int = 0
    peak_running: int = 0
    generated_tokens_total: int = 0
    prompt_tokens_computed_total: int = 0
    max_model_len: int = 0
    steps: int = 0
    # pinned prefixes (engine/pinning.py), version 3
    pinned_blocks: int = 0        # blocks held by the app's pins (also counted in used_blocks)
    max_pinned_blocks: int = 0    # the pin cap, in blocks
    chat_used_blocks: int = 0     # used blocks minus pinned ones no table holds (savings use this)

    def __post_init__(self):
        if not self.pinned_blocks:      # no pins: every used block is held by some table
            object.__setattr__(self, "chat_used_blocks", self.used_blocks)

    @property
    def shared_tokens_saved(self) -> int:
        """Tokens of KV that sharing avoided storing (sharing savings, in tokens)."""
        return max(0, self.logical_blocks - self.chat_used_blocks) * self.block_size

    def to_json(self) -> dict:
        out = asdict(self)
        out["shared_tokens_saved"] = self.shared_tokens_saved
        return out

    @classmethod
    def from_json(cls, d: dict) -> "KVStats":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


STATES = ("free", "used", "cached", "pinned")     # index = the state's code in `block_runs`
_STATE_OBJ = np.array(STATES, dtype=object)         # code -> the very str objects (tolist is cheap)
_CODE = {name: k for k, name in enumerate(STATES)}


class BlockArrays:
    """Per block, index = block id: state "pinned" / "used" / "cached" / "free", ref_count, tokens
    filled. "pinned" = held by an app pin (possibly also by chats; ref_count says how many).

    Two ways in: from lists (`BlockArrays(state, ref_count, filled)`, what from_json does), or
    from the pool's raw columns (`from_columns`, what the manager does on the engine thread: three
    array copies, no per-block Python work). In the second case the lists are built on first
    use, on the reader's thread, with numpy (about 10 ms for 350k blocks instead of a Python loop
    over every block). Treat the lists as read-only: one snapshot may be shared by many viewers.
    """

    __slots__ = ("_state", "_ref", "_filled", "_cols", "_codes", "_lock")

    def __init__(self, state, ref_count, filled):
        self._state, self._ref, self._filled = state, ref_count, filled
        self._cols = self._codes = None
        self._lock = threading.Lock()

    @classmethod
    def from_columns(cls, ref_counts, filled_counts, hashed, pinned_ids=()) -> "BlockArrays":
        """ref_counts / filled_counts: array("i"), hashed: array("b") (block_pool.BlockPool.columns()),
        copies owned by this snapshot; pinned_ids: ids held by an app pin."""
        out = cls(None, None, None)
        out._cols = (ref_counts, filled_counts, hashed, tuple(pinned_ids))
        return out

    # ---- numpy views (cheap; the reader's thread) -------------------------------------------
    def _np(self):
        """(codes int8, ref_count int32, filled int32) as numpy arrays."""
        with self._lock:
            if self._codes is None:
                if self._cols is not None:
                    ref, filled, hashed, pinned = self._cols
                    r = np.frombuffer(ref, dtype=np.intc) if len(ref) else np.zeros(0, np.intc)
                    f = np.frombuffer(filled, dtype=np.intc) if len(filled) else np.zeros(0, np.intc)
                    h = np.frombuffer(hashed, dtype=np.int8) if len(hashed) else np.zeros(0, np.int8)
                    codes = np.where(r > 0, np.int8(1), np.where(h != 0, np.int8(2), np.int8(0))).astype(np.int8)
                    if pinned:
                        codes[np.fromiter(pinned, dtype=np.int64, count=len(pinned))] = 3
                else:
                    codes = np.fromiter((_CODE[x] for x in self._state), dtype=np.int8, count=len(self._state))
                    r = np.asarray(self._ref, dtype=np.intc)
                    f = np.asarray(self._filled, dtype=np.intc)
                self._codes = (codes, r, f)
            return self._codes

    def _lists(self):
        if self._state is None:
            codes, r, f = self._np()
            with self._lock:
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
            return {"states": list(STATES), "start": [], "length": [], "state": [], "ref_count": [], "filled": []}
        cut = np.flatnonzero((codes[1:] != codes[:-1]) | (r[1:] != r[:-1]) | (f[1:] != f[:-1])) + 1
        start = np.concatenate(([0], cut))
        length = np.diff(np.concatenate((start, [n])))
        return {"states": list(STATES), "start": start.tolist(), "length": length.tolist(),
                "state": codes[start].tolist(), "ref_count": r[start].tolist(), "filled": f[start].tolist()}

    @classmethod
    def from_runs(cls, runs: dict) -> "BlockArrays":
        """The inverse of runs() (reads a compact snapshot)."""
        names = runs.get("states", STATES)
        state, ref, filled = [], [], []
        for s, n, c, r, f in zip(runs["start"], runs["length"], runs["state"], runs["ref_count"], runs["filled"]):
            state += [names[c]] * n
            ref += [r] * n
            filled += [f] * n
        return cls(state, ref, filled)

    def __eq__(self, other):
        if not isinstance(other, BlockArrays):
            return NotImplemented
        return self._lists() == other._lists()

    __hash__ = None

    def __len__(self) -> int:
        return len(self._cols[0]) if self._state is None else len(self._state)

    def __repr__(self) -> str:
        return f"BlockArrays({len(self)} blocks)"


@dataclass(frozen=True)
class SequenceView:
    """A running sequence or a parked session: its block table and what is shared."""
    seq_id: str | None            # None for a parked session
    session_id: str | None
    state: str                    # "running" | "idle_session"
    num_tokens: int
    num_computed: int
    block_table: list
    shared: list                  # per table entry: ref_count >= 2
    last_block_filled: int
    request_id: str | None = None
    title: str | None = None      # hook for the UI (e.g. a conversation title); the engine leaves it None


class LazySequenceViews(Sequence):
    """The sequences of a snapshot as the engine thread captured them (ids, counters and one copy
    of each block table as array("i")), turned into SequenceView objects on first use, on the
    reader's thread. Why: building 256 views of ~1,000 block ids each (lists, `shared` flags) is
    tens of milliseconds of Python that would otherwise stall the engine between two steps."""

    def __init__(self, raw: list, ref_counts, block_size: int):
        self._raw, self._ref, self._bs = raw, ref_counts, block_size
        self._views: list | None = None
        self._lock = threading.Lock()

    def _build(self) -> list:
        with self._lock:
            if self._views is None:
                r = np.frombuffer(self._ref, dtype=np.intc) if len(self._ref) else np.zeros(0, np.intc)
                views, bs = [], self._bs
                for seq_id, sid, state, ntok, nc, ids, rid in self._raw:
                    a = np.frombuffer(ids, dtype=np.intc) if len(ids) else np.zeros(0, np.intc)
                    views.append(SequenceView(
                        seq_id=seq_id, session_id=sid, state=state, num_tokens=ntok, num_computed=nc,
                        block_table=a.tolist(), shared=(r[a] >= 2).tolist(),
                        last_block_filled=nc - (len(a) - 1) * bs if len(a) else 0, request_id=rid))
                self._views, self._raw = views, None
            return self._views

    def __getitem__(self, i):
        return self._build()[i]

    def __len__(self) -> int:
        return len(self._views) if self._views is not None else len(self._raw)

    def __iter__(self):
        return iter(self._build())

    def __eq__(self, other):
        if isinstance(other, (list, LazySequenceViews)):
            return self._build() == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"LazySequenceViews({len(self)} sequences)"


@dataclass(frozen=True)
class PinView:
    """A pinned prefix (a shared system prompt the app holds): its name and blocks."""
    name: str
    num_tokens: int
    block_table: list


@dataclass(frozen=True)
class PreemptionEvent:
    request_id: str
    seq_id: str
    tokens_lost: int              # computed tokens dropped (recomputed on re-admission)
    time: float


@dataclass(frozen=True)
class KVSnapshot:
    time: float
    block_size: int
    num_blocks: int
    stats: KVStats
    blocks: BlockArrays
    sequences: list = field(default_factory=list)          # [SequenceView]
    preemption_events: list = field(default_factory=list)  # [PreemptionEvent], oldest first
    pins: list = field(default_factory=list)               # [PinView]

    @property
    def owners(self) -> dict:
        """Block id -> [seq_id or session_id, ...], derived from the block tables. Derived on the
        reader's thread (it is the costliest part at GPU pool sizes), never on the engine's."""
        owners: dict[int, list] = {}
        for s in self.sequences:
            who = s.seq_id if s.seq_id is not None else s.session_id
            for b in s.block_table:
                owners.setdefault(b, []).append(who)
        return owners

    def _owners_json(self) -> dict:
        """`owners` with str keys, built directly: blocks in one table only (most of them) get
        their one-element list in a comprehension, only blocks in several tables take the slow path."""
        seqs = list(self.sequences)
        if not seqs:
            return {}
        tables = [np.asarray(s.block_table, dtype=np.int64) for s in seqs]
        held = np.bincount(np.concatenate(tables), minlength=self.num_blocks) if any(len(t) for t in tables) \
            else np.zeros(0, np.int64)
        owners: dict[str, list] = {}
        for s, t in zip(seqs, tables):
            who = s.seq_id if s.seq_id is not None else s.session_id
            if not len(t):
                continue
            multi = held[t] > 1
            if not multi.any():
                owners.update({k: [who] for k in map(str, s.block_table)})
                continue
            for b, m in zip(s.block_table, multi.tolist()):
                if m:
                    owners.setdefault(str(b), []).append(who)
                else:
                    owners[str(b)] = [who]
        return owners

    def to_json(self, compact: bool = False) -> dict:
        """The /api/kv format (schema paged-chat.kv, VERSION). Block ids in `owners` are strings,
        as JSON object keys must be. compact=True leaves out the per-block lists ("blocks") and
        "owners": "block_runs" and the sequences' block tables carry the same information in a
        size that follows the live tables, not the pool (a 350k-block pool: kilobytes, not 13 MB)."""
        out = {"schema": SCHEMA, "version": VERSION, "time": self.time, "block_size": self.block_size,
               "num_blocks": self.num_blocks, "stats": self.stats.to_json()}
        if not compact:
            out["blocks"] = {"state": self.blocks.state, "ref_count": self.blocks.ref_count,
                             "filled": self.blocks.filled}
            out["owners"] = self._owners_json()                          # derived, see `owners`
        out["block_runs"] = self.blocks.runs()
        # shallow: the lists inside are fresh per snapshot (asdict's deep copy costs ~10x)
        out["sequences"] = [dict(vars(s)) for s in self.sequences]
        out["preemption_events"] = [dict(vars(e)) for e in self.preemption_events]
        out["pins"] = [dict(vars(p)) for p in self.pins]
        return out

    @classmethod
    def from_json(cls, d: dict) -> "KVSnapshot":
        if d.get("schema", SCHEMA) != SCHEMA or d.get("version", VERSION) > VERSION:
            raise ValueError(f"not a {SCHEMA} v<={VERSION} snapshot: {d.get('schema')} v{d.get('version')}")
        b = d.get("blocks")
        blocks = BlockArrays(b["state"], b["ref_count"], b["filled"]) if b is not None \
            else BlockArrays.from_runs(d["block_runs"])                   # a compact snapshot
        return cls(time=d["time"], block_size=d["block_size"], num_blocks=d["num_blocks"],
                   stats=KVStats.from_json(d["stats"]), blocks=blocks,
                   sequences=[SequenceView(**s) for s in d.get("sequences", [])],
                   preemption_events=[PreemptionEvent(**e) for e in d.get("preemption_events", [])],
                   pins=[PinView(**p) for p in d.get("pins", [])])
