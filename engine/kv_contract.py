"""The KV stats and snapshot contract between the engine and everything that watches it (the
dashboard, /metrics, /api/kv, the bench, the tests), as typed values with one JSON form.

Why one module: the contract used to be an untyped dict built in the manager, patched in the
engine and re-derived by hand elsewhere, so a renamed key broke a reader silently. These
dataclasses are its only definition. `to_json()` gives the documented, versioned JSON served at
/api/kv (see docs/DESIGN.md, "KV contract"); readers use that dict or the objects themselves.

Scale: blocks are parallel arrays (one list per field, index = block id), not one object per
block, so a 350k-block pool snapshots in tens of milliseconds; a snapshot is taken on demand
(between engine steps), never periodically on the engine thread.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

SCHEMA = "paged-chat.kv"
VERSION = 3          # 1: the untyped dict before issue 10; 2: this module (adds "schema", "version");
                     # 3: block state "pinned", "pins", stats pinned_blocks / max_pinned_blocks


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


@dataclass(frozen=True)
class BlockArrays:
    """Per block, index = block id: state "pinned" / "used" / "cached" / "free", ref_count, tokens
    filled. "pinned" = held by an app pin (possibly also by chats; ref_count says how many)."""
    state: list
    ref_count: list
    filled: list


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

    def to_json(self) -> dict:
        """The /api/kv format (schema paged-chat.kv, VERSION). Block ids in `owners` are strings,
        as JSON object keys must be."""
        return {
            "schema": SCHEMA, "version": VERSION, "time": self.time, "block_size": self.block_size,
            "num_blocks": self.num_blocks, "stats": self.stats.to_json(),
            "blocks": {"state": self.blocks.state, "ref_count": self.blocks.ref_count,
                       "filled": self.blocks.filled},
            "owners": {str(k): v for k, v in self.owners.items()},     # derived, see `owners`
            # shallow: the lists inside are fresh per snapshot (asdict's deep copy costs ~10x)
            "sequences": [dict(vars(s)) for s in self.sequences],
            "preemption_events": [dict(vars(e)) for e in self.preemption_events],
            "pins": [dict(vars(p)) for p in self.pins],
        }

    @classmethod
    def from_json(cls, d: dict) -> "KVSnapshot":
        if d.get("schema", SCHEMA) != SCHEMA or d.get("version", VERSION) > VERSION:
            raise ValueError(f"not a {SCHEMA} v<={VERSION} snapshot: {d.get('schema')} v{d.get('version')}")
        b = d["blocks"]
        return cls(time=d["time"], block_size=d["block_size"], num_blocks=d["num_blocks"],
                   stats=KVStats.from_json(d["stats"]), blocks=BlockArrays(b["state"], b["ref_count"], b["filled"]),
                   sequences=[SequenceView(**s) for s in d.get("sequences", [])],
                   preemption_events=[PreemptionEvent(**e) for e in d.get("preemption_events", [])],
                   pins=[PinView(**p) for p in d.get("pins", [])])
