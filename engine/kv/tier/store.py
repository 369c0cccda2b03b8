"""The second KV tier: full, hashed KV blocks kept outside the pool, keyed by the prefix cache's
own chained block hash (salt included), under a model fingerprint.

Why: the pool is the only place KV lives, so a block evicted from the prefix cache, a preempted
reply and every conversation after a restart are prefilled again. The tier keeps the exact bytes
of a block "as the pool holds it" (the slab kv_pool[:, :, block_id], whatever the pool's dtype,
quantization scales included), so loading one back is a copy, never a recompute.

Where the bytes live (`BlockStore`): on CPU, files under the app's cache folder (the pool is RAM
already; files survive a restart and the OS page cache keeps hot ones in memory); on CUDA, host
memory (`MemoryStore`; a restart starts it empty). The index (hash -> entry) is in memory and is
rebuilt at start-up from the files' headers, which is what makes a warm restart possible.

Safety: one folder per model fingerprint (weights sample, dtypes, block size, layer shapes,
layout version), so KV of another model or layout is never even looked at; each file's header
repeats the fingerprint, the hash and the block's identity (parent hash, token ids, salt), and a
checksum covers header and bytes, so a torn or corrupted file is dropped, never loaded. Files are
0600 in a 0700 folder, written to a temporary name and renamed (a crash leaves the old file or
none). The capacity counts what the store holds (header + checksum + bytes, a file's size) and
room is made before a block is written, so the folder never holds more than its cap, not even
for a moment (issue 48.7: a temporary file used to go past it before the shrink). An entry may carry an owner (a hash of the chat session id) so deleting a conversation
deletes its private blocks.

One engine thread calls it (through KVCacheManager), so there are no locks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Protocol, runtime_checkable

log = logging.getLogger("paged_chat.kv_tier")

MAGIC = b"PCKVT1\n"
LAYOUT_VERSION = 2  # bump when the slab layout of a block changes (engine KV layout version)
# 2: int8/fp8 rows may hold Hadamard-rotated K/V (the fingerprint names the rotation)
_HDR = struct.Struct("<I")


def owner_tag(session_id) -> str | None:
    """What the tier stores for a session id: a short hash (the id itself never goes to disk)."""
    if session_id is None:
        return None
    return hashlib.blake2b(str(session_id).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class BlockIdentity:
    """What the prefix cache verifies on a hit: parent hash, token ids, salt (as its repr)."""

    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    salt: str

    @staticmethod
    def of(block_hash, parent_hash, token_ids, salt) -> "BlockIdentity":
        return BlockIdentity(
            int(block_hash),
            None if parent_hash is None else int(parent_hash),
            tuple(int(t) for t in token_ids),
            repr(salt),
        )


@dataclass
class _Entry:
    ident: BlockIdentity
    nbytes: int  # the block's KV bytes
    owner: str | None
    stored: int = 0  # what the store holds for it (the file's size): what the cap counts
    kind: str = "kv"  # "kv": a block; "state": a linear-attention state (tier/state_entries.py)


@runtime_checkable
class BlockStore(Protocol):
    """Where a tier's bytes live. `scan` yields what survived from an earlier process."""

    persistent: bool

    def write(self, name: str, payload: bytes) -> None: ...
    def read(self, name: str) -> bytes | None: ...
    def delete(self, name: str) -> None: ...
    def scan(self) -> Iterator[tuple[str, bytes]]: ...  # (name, header bytes incl. magic)


class MemoryStore:
    """Host memory (the CUDA tier: the pool is on the device, so RAM is the next tier). Not
    persistent. Payloads are plain bytes; a pinned staging buffer is the runner's business."""

    persistent = False

    def __init__(self):
        self._d: dict[str, bytes] = {}

    def write(self, name, payload):
        self._d[name] = bytes(payload)

    def read(self, name):
        return self._d.get(name)

    def delete(self, name):
        self._d.pop(name, None)

    def scan(self):
        return iter(())


class FileStore:
    """One file per block in a 0700 folder, 0600 files, atomic rename. Reads use plain file I/O
    (the OS page cache keeps recently used blocks in RAM)."""

    persistent = True
    SUFFIX = ".kv"

    def __init__(self, folder: str):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(
            folder, 0o700
        )  # makedirs' mode is masked by the umask, and an old folder may be wider
        self.folder = folder

    def _path(self, name):
        return os.path.join(self.folder, name + self.SUFFIX)

    def write(self, name, payload):
        tmp = self._path(name) + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(payload)
        finally:
            os.close(fd)
        os.replace(tmp, self._path(name))

    def read(self, name):
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except OSError:
            return None

    def delete(self, name):
        for p in (self._path(name), self._path(name) + ".tmp"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def scan(self):
        for fn in sorted(os.listdir(self.folder), key=lambda f: self._mtime(f)):
            path = os.path.join(self.folder, fn)
            if fn.endswith(".tmp"):  # torn write of an earlier process
                os.unlink(path)
                continue
            if not fn.endswith(self.SUFFIX):
                continue
            try:
                with open(path, "rb") as f:
                    head = f.read(len(MAGIC) + _HDR.size)
                    if len(head) == len(MAGIC) + _HDR.size and head.startswith(MAGIC):
                        (n,) = _HDR.unpack(head[len(MAGIC) :])
                        head += f.read(min(n, 1 << 20))
            except OSError:
                continue
            yield fn[: -len(self.SUFFIX)], head

    def _mtime(self, fn):
        try:
            return os.stat(os.path.join(self.folder, fn)).st_mtime_ns
        except OSError:
            return 0

    def names_on_disk(self) -> set[str]:
        """For tests and the delete check: every block file present."""
        return {f[: -len(self.SUFFIX)] for f in os.listdir(self.folder) if f.endswith(self.SUFFIX)}


@dataclass(frozen=True)
class TierStats:
    kind: str  # "disk" or "host"
    blocks: int
    bytes: int  # what the store holds: file sizes (header + checksum + KV)
    capacity_bytes: int
    hits_blocks: int  # lookups that found a block here
    loads_blocks: int  # blocks copied back into the pool
    writes_blocks: int  # blocks written (write-back + write-through + swap-out)
    writebacks_blocks: int  # of which: evicted from the pool
    swapouts_blocks: int  # of which: a preempted sequence's blocks
    dropped_corrupt: int  # entries dropped because a checksum or identity check failed
    evicted_blocks: int  # entries dropped to stay under capacity
    deleted_blocks: int  # entries deleted with their conversation
    restored_blocks: int  # entries found at start-up (warm restart)
    load_s_per_block: float  # measured, EMA
    write_s_per_block: float
    state_entries: int = 0  # linear-attention states among the entries (not in `blocks`)


class KVTier:
    """The index + LRU + checksums over a BlockStore, for one model fingerprint."""

    def __init__(
        self, store: BlockStore, fingerprint: str, capacity_bytes: int, *, kind: str = "disk"
    ):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        self.store, self.fingerprint, self.capacity_bytes, self.kind = (
            store,
            fingerprint,
            int(capacity_bytes),
            kind,
        )
        self._index: OrderedDict[int, _Entry] = OrderedDict()  # LRU first
        self.bytes = 0
        self.hits = self.loads = self.writes = self.writebacks = self.swapouts = 0
        self.dropped_corrupt = self.evicted = self.deleted = 0
        self.load_s_per_block = 0.0
        self.write_s_per_block = 0.0
        self.state_entries = 0
        self.restored = self._reopen()

    # ---- names and payloads ---------------------------------------------------------------
    @staticmethod
    def _name(block_hash: int) -> str:
        return f"{block_hash & (2**64 - 1):016x}"

    def _payload(self, ident: BlockIdentity, data: bytes, owner, kind: str = "kv") -> bytes:
        meta = {
            "fp": self.fingerprint,
            "hash": ident.block_hash,
            "parent": ident.parent_hash,
            "tokens": list(ident.token_ids),
            "salt": ident.salt,
            "owner": owner,
            "nbytes": len(data),
        }
        if kind != "kv":  # a block's header is unchanged (its files stay valid)
            meta["kind"] = kind
        head = json.dumps(meta, separators=(",", ":")).encode()
        digest = hashlib.blake2b(head + data, digest_size=16).digest()
        return MAGIC + _HDR.pack(len(head)) + head + digest + data

    def _parse(self, payload: bytes, with_data: bool):
        """(meta, data or None) if the payload is well formed for this fingerprint, else None."""
        m = len(MAGIC) + _HDR.size
        if len(payload) < m or not payload.startswith(MAGIC):
            return None
        (n,) = _HDR.unpack(payload[len(MAGIC) : m])
        try:
            meta = json.loads(payload[m : m + n])
        except ValueError:
            return None
        if not isinstance(meta, dict) or meta.get("fp") != self.fingerprint:
            return None
        if not with_data:
            return meta, None
        digest, data = payload[m + n : m + n + 16], payload[m + n + 16 :]
        if (
            len(data) != meta.get("nbytes")
            or hashlib.blake2b(payload[m : m + n] + data, digest_size=16).digest() != digest
        ):
            return None
        return meta, data

    def _reopen(self) -> int:
        """Rebuild the index from what an earlier process left (headers only; data is checked
        when a block is loaded). Entries over capacity are dropped, oldest first."""
        n = 0
        for name, head in self.store.scan():
            parsed = self._parse(head, with_data=False)
            try:
                meta = parsed[0]
                ident = _ident_of(meta)
                ok = self._name(ident.block_hash) == name
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok:
                self.store.delete(name)
                self.dropped_corrupt += 1
                continue
            stored = len(head) + 16 + int(meta["nbytes"])  # header, checksum, bytes
            kind = str(meta.get("kind", "kv"))
            self._index[ident.block_hash] = _Entry(
                ident, int(meta["nbytes"]), meta.get("owner"), stored, kind
            )
            self.bytes += stored
            self.state_entries += kind == "state"
            n += 1
        self._shrink(0)
        return n

    # ---- the operations -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash) -> bool:
        return block_hash in self._index

    def has(self, ident: BlockIdentity) -> bool:
        """A block with exactly this identity is here (no I/O)."""
        e = self._index.get(ident.block_hash)
        return e is not None and e.ident == ident

    def entries(self) -> list[tuple[BlockIdentity, int, str | None]]:
        return [(e.ident, e.nbytes, e.owner) for e in self._index.values()]

    def has_room(self, nbytes: int) -> bool:
        """nbytes of KV could ever be held (a file adds a header of a few hundred bytes)."""
        return nbytes <= self.capacity_bytes

    def owner_of(self, ident: BlockIdentity) -> str | None:
        e = self._index.get(ident.block_hash)
        return e.owner if e is not None and e.ident == ident else None

    def put(
        self,
        ident: BlockIdentity,
        data: bytes,
        *,
        owner=None,
        reason: str = "writeback",
        kind: str = "kv",
    ) -> bool:
        """Store a block (no-op if it is already here). False if it cannot fit or the write failed.
        Room is made first (least recently used out), then the file is written: the store never
        holds more than the capacity, the temporary file included. kind "state": a linear-attention
        state (counted apart, and kept out of the per-block timings)."""
        e = self._index.get(ident.block_hash)
        if e is not None and e.ident == ident:
            self._index.move_to_end(ident.block_hash)
            return True
        payload = self._payload(ident, data, owner, kind)
        if len(payload) > self.capacity_bytes:
            return False
        t0 = time.perf_counter()
        if e is not None:  # same hash, other identity (collision): replaced
            self._forget(ident.block_hash)
            self.store.delete(self._name(ident.block_hash))
        self._shrink(len(payload))
        try:
            self.store.write(self._name(ident.block_hash), payload)
        except OSError as err:  # disk full, permissions: the tier is an optimisation only
            log.warning("KV tier write failed: %s", err)
            return False
        self._index[ident.block_hash] = _Entry(ident, len(data), owner, len(payload), kind)
        self.bytes += len(payload)
        if kind == "state":
            self.state_entries += 1
            return True
        self.writes += 1
        self.writebacks += reason == "writeback"
        self.swapouts += reason == "swap"
        self.write_s_per_block = _ema(self.write_s_per_block, time.perf_counter() - t0)
        return True

    def get(self, ident: BlockIdentity) -> bytes | None:
        """The block's bytes, verified; a torn or corrupted entry is dropped and None returned."""
        e = self._index.get(ident.block_hash)
        if e is None or e.ident != ident:
            return None
        t0 = time.perf_counter()
        payload = self.store.read(self._name(ident.block_hash))
        parsed = self._parse(payload, with_data=True) if payload is not None else None
        if parsed is None or _ident_of(parsed[0]) != ident:
            log.warning(
                "KV tier: block %s failed its checksum or identity check; dropped",
                self._name(ident.block_hash),
            )
            self._forget(ident.block_hash)
            self.store.delete(self._name(ident.block_hash))
            self.dropped_corrupt += 1
            return None
        self._index.move_to_end(ident.block_hash)
        if e.kind == "state":
            return parsed[1]
        self.hits += 1
        self.load_s_per_block = _ema(self.load_s_per_block, time.perf_counter() - t0)
        return parsed[1]

    def note_loaded(self, n: int) -> None:
        self.loads += n

    def delete(self, block_hash: int) -> bool:
        if block_hash not in self._index:
            return False
        self._forget(block_hash)
        self.store.delete(self._name(block_hash))
        self.deleted += 1
        return True

    def delete_owner(self, session_id) -> int:
        """Delete every block this session wrote as its own (its conversation was deleted)."""
        tag = owner_tag(session_id)
        doomed = [h for h, e in self._index.items() if tag is not None and e.owner == tag]
        for h in doomed:
            self.delete(h)
        return len(doomed)

    def _forget(self, block_hash: int) -> None:
        e = self._index.pop(block_hash)
        self.bytes -= e.stored
        self.state_entries -= e.kind == "state"

    def _shrink(self, extra: int, keep=None) -> None:
        """Drop least recently used entries until bytes + extra fits the capacity."""
        while self._index and self.bytes + extra > self.capacity_bytes:
            h = next(iter(self._index))
            if h == keep:
                break
            self._forget(h)
            self.store.delete(self._name(h))
            self.evicted += 1

    def stats(self) -> TierStats:
        return TierStats(
            kind=self.kind,
            blocks=len(self._index) - self.state_entries,
            bytes=self.bytes,
            capacity_bytes=self.capacity_bytes,
            hits_blocks=self.hits,
            loads_blocks=self.loads,
            writes_blocks=self.writes,
            writebacks_blocks=self.writebacks,
            swapouts_blocks=self.swapouts,
            dropped_corrupt=self.dropped_corrupt,
            evicted_blocks=self.evicted,
            deleted_blocks=self.deleted,
            restored_blocks=self.restored,
            load_s_per_block=self.load_s_per_block,
            write_s_per_block=self.write_s_per_block,
            state_entries=self.state_entries,
        )


def _ident_of(meta: dict) -> BlockIdentity:
    parent = meta["parent"]
    return BlockIdentity(
        int(meta["hash"]),
        None if parent is None else int(parent),
        tuple(int(t) for t in meta["tokens"]),
        str(meta["salt"]),
    )


def _ema(old: float, new: float, alpha: float = 0.2) -> float:
    return new if old == 0.0 else (1 - alpha) * old + alpha * new
