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
from itertools import chain, compress
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from engine.observe.kv_columns import STATES, BlockArrays, _no_gc, expand_ranges, id_ranges  # noqa: F401 (re-exported)

SCHEMA = "paged-chat.kv"
VERSION = 9  # 1: the untyped dict before issue 10; 2: this module (adds "schema", "version");
# 3: block state "pinned", "pins", stats pinned_blocks / max_pinned_blocks;
# 4: "block_runs" (run-length block states), to_json(compact=True) without
#    "blocks"/"owners"; every v3 field is still produced by default;
# 5: stats kv_cache_dtype / weights_kv_bytes_per_token (quantized KV, issue 22)
# 6: the second KV tier (stats tier_*, swap_preemptions, tokens_swapped_out,
#    tokens_recomputed_after_preempt; preemption events "mode", "tokens_swapped")
# 7: speculative decoding counters (stats spec_*)
# 8: stats shared_blocks leaves pinned blocks out (one vocabulary, issue 47:
#    shared = held by 2+ chats, not pinned), stats saved_blocks; KV cache groups
#    (stats num_groups, kv_groups, window_released_blocks, full_attention_blocks,
#    savings_vs_full_attention; blocks "group"; sequences "group_blocks",
#    "released_blocks"); one group: group 0 everywhere
# 9: state groups of linear-attention models (stats "state_groups", snapshot
#    "state_slots"); {} and [] for every other model


@dataclass(frozen=True)
class KVStats:
    """Counters: the manager's (pool, prefix cache, sharing) plus the engine's (scheduler)."""

    block_size: int
    total_blocks: int
    free_blocks: int
    used_blocks: int
    cached_blocks: int  # free but still holding a prefix-cache hash (revivable)
    shared_blocks: int  # held by 2+ block tables (ref_count >= 2), not pinned (issue 47)
    peak_used_blocks: int
    logical_blocks: int  # sum of every live table's length (what no sharing would use)
    kv_bytes_per_token: int
    kv_bytes_per_block: int
    kv_capacity_tokens: int
    used_tokens: int
    prefix_cache_queries: int  # tokens looked up
    prefix_cache_hits: int  # tokens found
    num_preemptions: int
    savings_vs_unshared: float  # 1 - chat_used_blocks / logical
    savings_vs_contiguous: float  # 1 - chat_used_blocks / (live sequences x max_model_len blocks)
    num_sequences: int
    num_idle_sessions: int  # parked sessions holding blocks between turns
    internal_fragmentation_tokens: int
    usage: float  # used / total, 0..1
    # engine-level (0 when read from a bare manager)
    running: int = 0
    waiting: int = 0
    peak_running: int = 0
    generated_tokens_total: int = 0
    prompt_tokens_computed_total: int = 0
    max_model_len: int = 0
    steps: int = 0
    # pinned prefixes (engine/kv/pinning.py), version 3
    pinned_blocks: int = 0  # blocks held by the app's pins (also counted in used_blocks)
    max_pinned_blocks: int = 0  # the pin cap, in blocks
    chat_used_blocks: int = 0  # used blocks minus pinned ones no table holds (savings use this)
    # the pool's format (kernels/kv_quant.py), version 5
    kv_cache_dtype: str = ""  # float32 / bfloat16 / float16 / int8 / fp8 ("" = unknown)
    weights_kv_bytes_per_token: int = (
        0  # what a token would cost at the weights' dtype (0 = unknown)
    )
    # the second KV tier (engine/kv/tier/store.py), version 6; tier_kind "" = no tier
    tier_kind: str = ""  # "disk" (CPU: files) or "host" (CUDA: host memory)
    tier_blocks: int = 0
    tier_bytes: int = 0
    tier_capacity_bytes: int = 0
    tier_hits_blocks: int = 0  # blocks read back from the tier
    tier_loaded_tokens: int = 0  # prompt tokens served by tier loads (also in prefix_cache_hits)
    tier_writes_blocks: int = 0  # write-back + write-through + swap-out
    tier_writebacks_blocks: int = 0
    tier_swapouts_blocks: int = 0
    tier_dropped_corrupt: int = 0
    tier_evicted_blocks: int = 0
    tier_deleted_blocks: int = 0
    tier_restored_blocks: int = 0  # entries found at start-up (warm restart)
    swap_preemptions: int = 0  # preemptions that swapped out instead of dropping
    tokens_swapped_out: int = 0
    tokens_recomputed_after_preempt: int = 0
    # speculative decoding (engine/sampling/speculative/), version 7; all 0 with it off
    spec_num_drafts: int = 0  # verification steps (one per sequence that had a draft)
    spec_draft_tokens: int = 0  # draft tokens scored
    spec_accepted_tokens: int = 0  # draft tokens accepted (each one a step saved)
    spec_rollbacks: int = 0  # verification steps that gave rejected slots back
    spec_rolled_back_slots: int = 0  # slots of rejected draft tokens returned to the pool
    # KV cache groups (engine/kv/cache_spec.py), version 8; one group: 1, 0, logical_blocks, ...
    num_groups: int = 1
    window_released_blocks: int = 0  # blocks sliding windows gave back since start (all groups)
    full_attention_blocks: int = 0  # live tables' entries, released ones included: what paging
    # without windows would hold for the same chats
    savings_vs_full_attention: float = 0.0  # 1 - chat_used_blocks / full_attention_blocks
    kv_groups: list = field(default_factory=list)  # per group: {group, kind, sliding_window,
    # layers, used_blocks, held_blocks, released_entries, window_released_blocks}
    # state groups (engine/kv/state_groups.py), version 9: {} for a model without linear-attention
    # layers, else {state_slots_total, _used, _free, _shared, state_bytes_per_slot, state_checkpoints,
    # state_checkpoint_hits, state_checkpoints_taken, state_cow_copies, state_peak_used_slots,
    # state_tier_loads, state_tier_writes: states read from / written to the KV tier}
    state_groups: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.pinned_blocks:  # no pins: every used block is held by some table
            object.__setattr__(self, "chat_used_blocks", self.used_blocks)

    @property
    def shared_tokens_saved(self) -> int:
        """Tokens of KV that sharing avoided storing (sharing savings, in tokens)."""
        return self.saved_blocks * self.block_size

    @property
    def saved_blocks(self) -> int:
        """Saved by sharing: blocks paging without sharing would hold (every table entry) minus the
        blocks the chats hold. The one definition the dashboard, /metrics and /api/kv report."""
        return max(0, self.logical_blocks - self.chat_used_blocks)

    def to_json(self) -> dict:
        out = asdict(self)
        out["shared_tokens_saved"] = self.shared_tokens_saved
        out["saved_blocks"] = self.saved_blocks
        return out

    @classmethod
    def from_json(cls, d: dict) -> "KVStats":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class SequenceView:
    """A running sequence or a parked session: its block table and what is shared."""

    seq_id: str | None  # None for a parked session
    session_id: str | None
    state: str  # "running" | "idle_session"
    num_tokens: int
    num_computed: int
    block_table: list
    shared: list  # per table entry: ref_count >= 2
    last_block_filled: int
    request_id: str | None = None
    title: str | None = (
        None  # hook for the UI (e.g. a conversation title); the engine leaves it None
    )
    group_blocks: list | None = None  # live blocks per KV cache group (block_table: group 0 first)
    released_blocks: int = 0  # table entries the sliding windows gave back (v8)


def compact_sequence(s: dict) -> dict:
    """One sequence of the full JSON in compact form: "block_table" becomes "block_ranges",
    "shared" is dropped (ref_count >= 2 in "block_runs" says it)."""
    out = {k: v for k, v in s.items() if k not in ("block_table", "shared")}
    out["block_ranges"] = id_ranges(s["block_table"])
    return out


def compact_json(d: dict) -> dict:
    """A full /api/kv dict (possibly scoped to one viewer) in compact form: no "blocks", no
    "owners", sequences with "block_ranges". Requires "block_runs" (v4)."""
    out = {k: v for k, v in d.items() if k not in ("blocks", "owners", "sequences")}
    out["compact"] = True
    out["sequences"] = [compact_sequence(s) for s in d.get("sequences", [])]
    return out


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
        with self._lock, _no_gc():
            if self._views is None:
                r = (
                    np.frombuffer(self._ref, dtype=np.intc)
                    if len(self._ref)
                    else np.zeros(0, np.intc)
                )
                views = []
                for seq_id, sid, state, ntok, nc, ids, rid, last, per_group, released in self._raw:
                    a = np.frombuffer(ids, dtype=np.intc) if len(ids) else np.zeros(0, np.intc)
                    views.append(
                        SequenceView(
                            seq_id=seq_id,
                            session_id=sid,
                            state=state,
                            num_tokens=ntok,
                            num_computed=nc,
                            block_table=a.tolist(),
                            shared=(r[a] >= 2).tolist(),
                            last_block_filled=last,
                            request_id=rid,
                            group_blocks=list(per_group),
                            released_blocks=released,
                        )
                    )
                self._views = views
            return self._views

    def compact_dicts(self) -> list[dict]:
        """The sequences' compact JSON (see `compact_sequence`), straight from the captured
        arrays: no SequenceView, no per-block list is built."""
        out = []
        for seq_id, sid, state, ntok, nc, ids, rid, last, per_group, released in self._raw:
            a = np.frombuffer(ids, dtype=np.intc) if len(ids) else np.zeros(0, np.intc)
            out.append(
                {
                    "seq_id": seq_id,
                    "session_id": sid,
                    "state": state,
                    "num_tokens": ntok,
                    "num_computed": nc,
                    "block_ranges": id_ranges(a),
                    "last_block_filled": last,
                    "request_id": rid,
                    "title": None,
                    "group_blocks": list(per_group),
                    "released_blocks": released,
                }
            )
        return out

    def __getitem__(self, i):
        return self._build()[i]

    def __len__(self) -> int:
        return len(self._raw)

    def __iter__(self):
        return iter(self._build())

    def __eq__(self, other):
        if isinstance(other, (list, LazySequenceViews)):
            return self._build() == list(other)
        return NotImplemented

    __hash__ = None

    def __reduce__(self):  # copy / deepcopy / pickle: a plain list of the views
        return (list, (self._build(),))

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
    tokens_lost: int  # computed tokens dropped (recomputed on re-admission)
    time: float
    mode: str = "recompute"  # "swap": full blocks went to the KV tier (version 6)
    tokens_swapped: int = 0


@dataclass(frozen=True)
class TierLoadEvent:
    """A sequence admitted with blocks loaded from the KV tier instead of computed (v6)."""

    request_id: str | None
    seq_id: str | None
    session_id: str | None
    tokens_loaded: int  # from the tier (disk or host memory)
    tokens_cached: int  # already in the pool
    tokens_computed: int  # prompt tokens left to compute
    kind: str  # "disk" or "host"
    time: float


@dataclass(frozen=True)
class StateSlotView:
    """One held state slot of a linear-attention model (engine/kv/state_pool.py): its holders
    (running sequence ids, parked session ids, "checkpoint"), the tokens its state has seen
    (a checkpoint's boundary; -1 where the holder's own position says it) and the bytes it holds."""

    slot: int
    ref_count: int
    holders: list
    tokens: int
    bytes: int
    checkpoint_uses: int = 0  # prefix hits a checkpoint served


@dataclass(frozen=True)
class KVSnapshot:
    time: float
    block_size: int
    num_blocks: int
    stats: KVStats
    blocks: BlockArrays
    sequences: list = field(default_factory=list)  # [SequenceView]
    preemption_events: list = field(default_factory=list)  # [PreemptionEvent], oldest first
    pins: list = field(default_factory=list)  # [PinView]
    tier_events: list = field(default_factory=list)  # [TierLoadEvent], oldest first (v6)
    state_slots: list = field(default_factory=list)  # [StateSlotView], held slots (v9)

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
        """`owners` with str keys, built directly. Blocks held by one table only (most of them)
        all point at that table's one shared one-element list (250k separate lists cost 3x
        more to build); blocks in several tables get their own list. Read-only, like the rest
        of a snapshot's JSON (it may be shared by many viewers)."""
        with _no_gc():
            return self._owners_json_build(list(self.sequences))

    def _owners_json_build(self, seqs: list) -> dict:
        lens = [len(s.block_table) for s in seqs]
        if not sum(lens):
            return {}
        ids = np.fromiter(
            chain.from_iterable(s.block_table for s in seqs), dtype=np.int64, count=sum(lens)
        )
        once = np.bincount(ids, minlength=self.num_blocks)[ids] == 1
        keys = list(map(str, ids.tolist()))  # C-level passes over every entry
        once_l, multi_l = once.tolist(), (~once).tolist()
        owners: dict[str, list] = {}
        pos = 0
        for s, n in zip(seqs, lens):
            who = s.seq_id if s.seq_id is not None else s.session_id
            ks, end = keys[pos : pos + n], pos + n
            if not once[pos:end].all():  # blocks shared with other tables
                for k in compress(ks, multi_l[pos:end]):
                    owners.setdefault(k, []).append(who)
                ks = compress(ks, once_l[pos:end])
            owners.update(dict.fromkeys(ks, [who]))  # one list per table: see above
            pos = end
        return owners

    def to_json(self, compact: bool = False) -> dict:
        """The /api/kv format (schema paged-chat.kv, VERSION). Block ids in `owners` are strings,
        as JSON object keys must be. compact=True (v4; marked "compact": true) leaves out the
        per-block lists ("blocks") and "owners", and gives each sequence "block_ranges" instead
        of "block_table"/"shared": with "block_runs" that is the same information in a size that
        follows the number of runs, not the pool (350k blocks: kilobytes, not 13 MB)."""
        out = {
            "schema": SCHEMA,
            "version": VERSION,
            "time": self.time,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "stats": self.stats.to_json(),
        }
        if compact:
            out["compact"] = True
        else:
            out["blocks"] = {
                "state": self.blocks.state,
                "ref_count": self.blocks.ref_count,
                "filled": self.blocks.filled,
                "group": self.blocks.group,
            }
            out["owners"] = self._owners_json()  # derived, see `owners`
        out["block_runs"] = self.blocks.runs()
        if (
            not compact
        ):  # shallow: the lists inside are fresh per snapshot (asdict's deep copy costs ~10x)
            out["sequences"] = [dict(vars(s)) for s in self.sequences]
        elif isinstance(self.sequences, LazySequenceViews):
            out["sequences"] = self.sequences.compact_dicts()
        else:
            out["sequences"] = [compact_sequence(dict(vars(s))) for s in self.sequences]
        out["preemption_events"] = [dict(vars(e)) for e in self.preemption_events]
        out["tier_events"] = [dict(vars(e)) for e in self.tier_events]
        out["pins"] = [dict(vars(p)) for p in self.pins]
        out["state_slots"] = [dict(vars(v)) for v in self.state_slots]
        return out

    @classmethod
    def from_json(cls, d: dict) -> "KVSnapshot":
        if d.get("schema", SCHEMA) != SCHEMA or d.get("version", VERSION) > VERSION:
            raise ValueError(
                f"not a {SCHEMA} v<={VERSION} snapshot: {d.get('schema')} v{d.get('version')}"
            )
        b = d.get("blocks")
        blocks = (
            BlockArrays(b["state"], b["ref_count"], b["filled"], b.get("group"))
            if b is not None
            else BlockArrays.from_runs(d["block_runs"])
        )  # a compact snapshot
        seqs = []
        for s in d.get("sequences", []):
            if "block_ranges" in s:  # compact
                s = dict(s)
                s["block_table"] = expand_ranges(s.pop("block_ranges"))
                s["shared"] = [blocks.ref_count[i] >= 2 for i in s["block_table"]]
            seqs.append(SequenceView(**s))
        return cls(
            time=d["time"],
            block_size=d["block_size"],
            num_blocks=d["num_blocks"],
            stats=KVStats.from_json(d["stats"]),
            blocks=blocks,
            sequences=seqs,
            preemption_events=[PreemptionEvent(**e) for e in d.get("preemption_events", [])],
            pins=[PinView(**p) for p in d.get("pins", [])],
            tier_events=[TierLoadEvent(**e) for e in d.get("tier_events", [])],
            state_slots=[StateSlotView(**v) for v in d.get("state_slots", [])],
        )
