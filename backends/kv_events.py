"""KV-cache events as a serving engine publishes them (vLLM's ZMQ publisher, msgpack), read
tolerantly into four small records: `Stored`, `Removed`, `Cleared` and `Unknown`.

The wire format (vLLM `vllm/distributed/kv_events.py`; SGLang publishes the same classes):
- one ZMQ message = three frames: topic, an 8-byte big-endian sequence number, the payload;
- the payload is a msgpack `KVEventBatch`, an array `[ts, events, data_parallel_rank]`;
- each event is a msgpack map tagged by its class name under "type" (vLLM 0.10 and later:
  `{"type": "BlockStored", "block_hashes": [...], ...}`) or, in older releases and SGLang, an array
  whose first item is that name, then the fields in declaration order
  (`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`).

Why decode by hand instead of into typed structs: one event of a kind this reader does not know
(a newer engine) or one bad field must cost that event, not the batch or the reader. The untyped
msgpack decode is msgspec's C decoder, so the hand part is only the field picking.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

SEQ_BYTES = 8
END_SEQ = -1  # the replay socket's "no more batches" marker (signed)

_decoder = msgspec.msgpack.Decoder()

# field order of the array form (older vLLM, SGLang); the map form names them
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class Malformed(ValueError):
    """A payload or an event that is not a KV-event batch as documented."""


@dataclass(slots=True)
class Stored:
    """Blocks newly cached (or, with vLLM's `kv_cache_report_mode="full"`, reused): one hash per
    full block, in prefix order; `parent` is the hash of the block before the first one."""

    hashes: list
    parent: int | bytes | None
    token_ids: list
    block_size: int
    medium: str | None = None
    lora: str | None = None
    extra_keys: list | None = None  # one entry (tuple or None) per block
    group: int | None = None
    kind: str | None = None


@dataclass(slots=True)
class Removed:
    hashes: list
    medium: str | None = None
    group: int | None = None


@dataclass(slots=True)
class Cleared:
    """Every cached block of the engine is gone (vLLM: a prefix-cache reset)."""


@dataclass(slots=True)
class Unknown:
    """An event kind this reader does not know; counted and shown, never applied."""

    kind: str


@dataclass(slots=True)
class Batch:
    ts: float
    events: list
    dp_rank: int | None = None
    bad_events: int = 0  # events in the batch that could not be read (skipped)


def _is_hash(h) -> bool:
    return isinstance(h, (bytes, int)) and not isinstance(h, bool)


def _hashes(v) -> list:
    if not isinstance(v, list) or not all(_is_hash(h) for h in v):
        raise Malformed("block_hashes is not a list of ints or bytes")
    return v


def _opt_str(v) -> str | None:
    return v if isinstance(v, str) else None


def _opt_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _fields(raw, order: tuple) -> dict:
    if isinstance(raw, dict):
        return raw
    return dict(zip(order, raw[1:]))


def event(raw) -> Stored | Removed | Cleared | Unknown:
    """One decoded msgpack event (map or tagged array) -> a record; Malformed when unreadable."""
    if isinstance(raw, dict):
        kind = raw.get("type")
    elif isinstance(raw, list) and raw:
        kind = raw[0]
    else:
        raise Malformed(f"an event is a {type(raw).__name__}, not a map or a tagged array")
    if not isinstance(kind, str):
        raise Malformed("an event has no kind")
    if kind == "BlockStored":
        f = _fields(raw, _STORED_FIELDS)
        hashes = _hashes(f.get("block_hashes"))
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids") or []
        size = f.get("block_size")
        if parent is not None and not _is_hash(parent):
            raise Malformed("parent_block_hash is not an int or bytes")
        if (
            not isinstance(tokens, list)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size <= 0
        ):
            raise Malformed("token_ids / block_size unreadable")
        extra = f.get("extra_keys")
        return Stored(
            hashes,
            parent,
            tokens,
            size,
            _opt_str(f.get("medium")),
            _opt_str(f.get("lora_name")),
            extra if isinstance(extra, list) else None,
            _opt_int(f.get("group_idx")),
            _opt_str(f.get("kv_cache_spec_kind")),
        )
    if kind == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS)
        return Removed(
            _hashes(f.get("block_hashes")), _opt_str(f.get("medium")), _opt_int(f.get("group_idx"))
        )
    if kind == "AllBlocksCleared":
        return Cleared()
    return Unknown(kind[:60])


def decode_batch(payload: bytes) -> Batch:
    """A KVEventBatch payload -> Batch. Malformed if the batch itself is unreadable; an unreadable
    event inside a readable batch is skipped and counted in `bad_events`."""
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError) as e:
        raise Malformed(f"not msgpack: {e}") from None
    if isinstance(raw, dict):  # a batch encoded as a map (not vLLM's own form)
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise Malformed("not a [ts, events, ...] batch")
    ts = raw[0] if isinstance(raw[0], (int, float)) and not isinstance(raw[0], bool) else 0.0
    out, bad = [], 0
    for e in raw[1]:
        try:
            out.append(event(e))
        except Malformed:
            bad += 1
    return Batch(float(ts), out, _opt_int(raw[2]) if len(raw) > 2 else None, bad)


def seq_of(frame: bytes) -> int:
    """The sequence frame: 8 bytes, big-endian, signed (the replay end marker is -1)."""
    if len(frame) != SEQ_BYTES:
        raise Malformed(f"a sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


def encode_batch(events: list, ts: float = 0.0, dp_rank: int | None = 0) -> bytes:
    """The payload vLLM would send for `events` (dicts in its map form): for tests and fixtures."""
    return msgspec.msgpack.encode([ts, events, dp_rank])
