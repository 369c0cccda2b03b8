"""The replicas of a cluster, each with its KV-event model and its /metrics, and what they hold in
common: the numbers of the cluster Memory tab (ui/dashboard/cluster_view.py words them).

Why the cross-replica arithmetic sits here: which blocks two replicas both cache is a fact about
the engines' hashes, not about drawing. vLLM's block hash is a chain over the prefix (parent hash,
the block's tokens, extra keys such as a cache salt), and with its default sha256 hashing every
replica computes the same hash for the same prefix (a fixed seed unless PYTHONHASHSEED is set, so
set the same value on all replicas or none). The same hash on two replicas is the same prefix
prefilled and stored twice: a prefix-aware router would have sent the second request to the
first replica and saved that copy.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from backends.kv_blocks import ReplicaBlocks
from backends.kv_feed import Feed
from backends.kv_subscriber import Subscriber, parse_spec
from backends.prometheus import parse, sample

TOP_ROOTS = 40
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}\s", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def cache_config(text: str) -> dict:
    """vLLM's `vllm:cache_config_info` labels (block_size, num_gpu_blocks, cache_dtype, ...)."""
    m = _CACHE_INFO.search(text or "")
    return dict(_LABEL.findall(m.group(1))) if m else {}


def load_tokenizer(folders: list[str]):
    """The first folder's tokenizer.json (the `tokenizers` library, no model needed), or None."""
    for folder in folders:
        path = os.path.join(folder, "tokenizer.json")
        if os.path.isfile(path):
            try:
                from tokenizers import Tokenizer

                return Tokenizer.from_file(path)
            except Exception:
                continue
    return None


KV_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "float32": 4, "fp32": 4}


def kv_bytes_per_token(folders: list[str], cache_dtype: str | None) -> int | None:
    """2 (K and V) x layers x KV heads x head_dim x bytes, from the model's config.json; a cache
    dtype of "auto" counts 2 bytes (vLLM serves an fp32 checkpoint in bf16 on CPU and GPU)."""
    for folder in folders:
        try:
            with open(os.path.join(folder, "config.json")) as f:
                c = json.load(f)
            c = c.get("text_config", c)
            heads = int(c["num_attention_heads"])
            kv = int(c.get("num_key_value_heads") or heads)
            dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
            return (
                2
                * int(c["num_hidden_layers"])
                * kv
                * dim
                * KV_DTYPE_BYTES.get(cache_dtype or "auto", 2)
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _int(v) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


@dataclass
class RootSnap:
    """One prefix tree of one replica."""

    h64: int
    blocks: int
    tokens: int
    label_ids: list | None  # its first token ids (None: its first block was never seen)
    salt: tuple  # extra keys of its first block (a cache salt, a LoRA name, ...)
    rid: int = -1  # its id in the replica's model
    copied: int = 0  # of its blocks, those another replica caches too


@dataclass
class ReplicaSnap:
    name: str
    has_events: bool
    error: str | None = None
    blocks: int = 0
    tokens: int = 0
    block_size: int | None = None
    by_medium: dict = field(default_factory=dict)
    kinds: dict = field(default_factory=dict)
    salted_blocks: int = 0
    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # unique, sorted
    hash_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    hash_root: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.uint64)
    )  # root h64 per hash
    roots: list = field(default_factory=list)  # RootSnap, largest first
    events_per_s: float = 0.0
    counts: dict = field(default_factory=dict)
    joined_late: bool = False
    last_event_age_s: float | None = None
    kv_usage: float | None = None
    pool_blocks: int | None = None
    block_bytes: float | None = (
        None  # KV bytes of one block (its /metrics, else the model's config)
    )
    copied_blocks: int = 0  # cached blocks another replica caches too
    kv_dtype: str | None = None  # vLLM's cache_dtype label ("auto": the model's dtype)
    running: float | None = None
    waiting: float | None = None
    hit_rate: float | None = None


class Replica:
    """One replica: its chat engine (None behind a router), its events, its /metrics."""

    def __init__(self, name: str, engine, kv_spec: str | None, max_blocks: int = 4_000_000):
        self.name, self.engine, self.kv_spec = name, engine, kv_spec
        self.has_events = kv_spec is not None  # (a recorded stream replayed: set True)
        self.blocks = ReplicaBlocks(max_blocks=max_blocks)
        self.feed = Feed(self.blocks)
        self.subscriber = Subscriber(self.feed, *parse_spec(kv_spec)) if kv_spec else None
        self.metrics_text: str | None = None
        self._polled = 0.0

    def poll_metrics(self, min_interval_s: float = 0.9) -> None:
        if self.engine is None or time.time() - self._polled < min_interval_s:
            return
        self._polled = time.time()
        self.metrics_text = self.engine.metrics_text()

    def snap(self, top: int = TOP_ROOTS) -> ReplicaSnap:
        """Copies of what the page needs, taken under the feed's lock (the reader thread waits)."""
        out = ReplicaSnap(self.name, self.has_events)
        if self.subscriber is not None:
            out.error = self.subscriber.error
        with self.feed.lock:
            b = self.blocks
            slots = b.live_slots()
            c = b.cols
            h, tok, root = c["h64"][slots], c["tokens"][slots].astype(np.int64), c["root"][slots]
            med, kind, salt = c["medium"][slots], c["kind"][slots], c["salt"][slots]
            rid = np.fromiter(b.roots.keys(), dtype=np.int64, count=len(b.roots))
            rh = np.fromiter((x.h64 for x in b.roots.values()), dtype=np.uint64, count=len(b.roots))
            media, kinds = list(b.media.values), list(b.kinds.values)
            out.block_size = b.block_size
            out.counts = {**b.counts, **self.feed.counts}
            out.events_per_s = self.feed.events_per_s()
            out.joined_late = self.feed.joined_late()
            if self.feed.last_event_at is not None:
                out.last_event_age_s = time.time() - self.feed.last_event_at
            if len(slots):
                per_root = np.bincount(root)
                order = np.argsort(-per_root, kind="stable")[:top]
                out.roots = [
                    self._root_snap(int(r), int(per_root[r]))
                    for r in order
                    if per_root[r] and int(r) in b.roots
                ]
        out.blocks, out.tokens = len(slots), int(tok.sum())
        if len(slots):
            out.by_medium = {
                str(media[m] or "unspecified"): int(n) for m, n in enumerate(np.bincount(med)) if n
            }
            out.kinds = {
                str(kinds[k]): int(n) for k, n in enumerate(np.bincount(kind)) if n and kinds[k]
            }
            out.salted_blocks = int((salt > 0).sum())
            tok_root = np.bincount(root, weights=tok)
            for r in out.roots:
                r.tokens = int(tok_root[r.rid])
            sort = np.argsort(rid)
            root_h = rh[sort][np.searchsorted(rid[sort], root)]
            out.hashes, first = _unique(h)
            out.hash_tokens, out.hash_root = tok[first], root_h[first]
        self._metrics_into(out)
        return out

    def _root_snap(self, r: int, blocks: int) -> RootSnap:
        x = self.blocks.roots[r]
        return RootSnap(
            x.h64,
            blocks,
            0,
            x.tokens.tolist() if x.tokens is not None else None,
            self.blocks.salts.values[x.salt] or (),
            r,
        )

    def label(self, root_h64: int) -> tuple[list | None, tuple] | None:
        """First token ids and salt of the prefix tree whose first block hashes to root_h64."""
        with self.feed.lock:
            x = self.blocks.roots.get(self.blocks.root_by_h64.get(root_h64, -1))
            if x is None:
                return None
            return x.tokens.tolist() if x.tokens is not None else None, self.blocks.salts.values[
                x.salt
            ] or ()

    def _metrics_into(self, out: ReplicaSnap) -> None:
        text = self.metrics_text
        if not text:
            return
        s = sample(parse(text))
        out.kv_usage, out.running, out.waiting = s.kv_usage, s.running, s.waiting
        if s.prefix_queries:
            out.hit_rate = (s.prefix_hits or 0.0) / s.prefix_queries
        cfg = cache_config(text)
        out.pool_blocks = _int(cfg.get("num_gpu_blocks"))
        mem = _int(cfg.get("kv_cache_memory_bytes"))
        if mem and out.pool_blocks and _int(cfg.get("num_gpu_blocks_override")) is None:
            out.block_bytes = mem / out.pool_blocks  # (an override shrinks the pool, not this)
        out.kv_dtype = cfg.get("cache_dtype")
        if out.block_size is None:
            out.block_size = _int(cfg.get("block_size"))

    def start(self) -> None:
        if self.subscriber is not None:
            self.subscriber.start()

    def stop(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()


@dataclass
class SharedPrefix:
    """Blocks of one prefix tree that several replicas cache."""

    root_h64: int
    label_ids: list | None
    salt: tuple
    holders: list  # replica names holding at least one of its copied blocks
    copies: int  # the most replicas holding one block of it
    blocks_on_all: int  # blocks of it held by `copies` replicas
    tokens_on_all: int
    avoidable_blocks: int  # sum over its blocks of (replicas holding it - 1)
    avoidable_tokens: int


@dataclass
class ClusterNumbers:
    replicas: list  # ReplicaSnap
    unique_blocks: int = 0  # distinct blocks over the cluster
    held_blocks: int = 0  # blocks summed over replicas
    avoidable_blocks: int = 0  # held - unique: copies a prefix-aware router would not make
    avoidable_tokens: int = 0
    on_all: int = 0  # distinct blocks every replica (with events) holds
    shared: list = field(default_factory=list)  # SharedPrefix, most avoidable first


def _unique(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values of h and one index of each (np.unique(return_index) without its
    stable sort, which costs twice as much on a million random 64-bit hashes)."""
    order = np.argsort(h)
    hs = h[order]
    keep = np.ones(len(hs), dtype=bool)
    keep[1:] = hs[1:] != hs[:-1]
    return hs[keep], order[keep]


def cluster_numbers(snaps: list[ReplicaSnap], top: int = 12) -> ClusterNumbers:
    """Which blocks several replicas hold, grouped by prefix tree (pure: tested on its own)."""
    out = ClusterNumbers(snaps)
    live = [s for s in snaps if s.has_events and len(s.hashes)]
    if not live:
        return out
    h = np.concatenate([s.hashes for s in live])
    tok = np.concatenate([s.hash_tokens for s in live])
    root = np.concatenate([s.hash_root for s in live])
    who = np.concatenate([np.full(len(s.hashes), i) for i, s in enumerate(live)])
    order = np.argsort(h)  # one quicksort: np.unique's stable sort is ~2x slower
    hs = h[order]
    start = np.ones(len(hs), dtype=bool)
    start[1:] = hs[1:] != hs[:-1]
    grp = np.cumsum(start) - 1
    n = np.bincount(grp)  # replicas holding each distinct hash
    inv = np.empty(len(h), dtype=np.int64)
    inv[order] = grp
    first = order[start]  # one row of each distinct hash
    out.unique_blocks, out.held_blocks = len(n), len(h)
    out.avoidable_blocks = int(len(h) - len(n))
    out.avoidable_tokens = int(((n - 1) * tok[first]).sum())
    n_live = sum(1 for s in snaps if s.has_events)
    out.on_all = int((n == n_live).sum()) if n_live > 1 else 0
    copied = n >= 2
    if not copied.any():
        return out
    c_root, c_n, c_tok = root[first][copied], n[copied], tok[first][copied]
    g_ids, g_inv = np.unique(c_root, return_inverse=True)
    avoid_b = np.bincount(g_inv, weights=c_n - 1)
    avoid_t = np.bincount(g_inv, weights=(c_n - 1) * c_tok)
    most = np.zeros(len(g_ids), dtype=np.int64)
    np.maximum.at(most, g_inv, c_n)
    on = c_n == most[g_inv]
    on_b = np.bincount(g_inv, weights=on)
    on_t = np.bincount(g_inv, weights=on * c_tok)
    labels = {}
    for s in live:
        for r in s.roots:
            if r.h64 not in labels or (labels[r.h64][0] is None and r.label_ids):
                labels[r.h64] = (r.label_ids, r.salt)
    copied_rows = copied[inv]
    rows_root, rows_who = root[copied_rows], who[copied_rows]
    for i, s in enumerate(live):
        mine = rows_root[rows_who == i]
        s.copied_blocks = len(mine)
        per = dict(zip(*(x.tolist() for x in np.unique(mine, return_counts=True))))
        for r in s.roots:
            r.copied = per.get(r.h64, 0)
    for g in np.lexsort((g_ids, -avoid_b))[:top]:
        holders = np.unique(rows_who[rows_root == g_ids[g]])
        lab = labels.get(int(g_ids[g]), (None, ()))
        out.shared.append(
            SharedPrefix(
                int(g_ids[g]),
                lab[0],
                lab[1],
                [live[w].name for w in holders],
                int(most[g]),
                int(on_b[g]),
                int(on_t[g]),
                int(avoid_b[g]),
                int(avoid_t[g]),
            )
        )
    return out


class Cluster:
    """The replicas and the recent turns' landings; `numbers()` for the page."""

    def __init__(self, replicas: list[Replica], tokenizer_folders: list[str] | None = None):
        self.replicas = replicas
        self._lock = threading.Lock()
        self.started = False
        self.tokenizer_folders = list(tokenizer_folders or [])
        self._tokenizer = None

    def decode(self, ids: list[int]) -> str | None:
        """A prefix's first token ids as text (special tokens dropped), with the backend model's
        tokenizer.json when one of the folders has it; None otherwise (the page shows the hash)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_folders) or False
        if not self._tokenizer:
            return None
        try:
            return self._tokenizer.decode(list(ids), skip_special_tokens=True)
        except Exception:
            return None

    def start(self) -> None:
        with self._lock:
            if not self.started:
                self.started = True
                for r in self.replicas:
                    r.start()

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    def has_events(self) -> bool:
        return any(r.subscriber is not None for r in self.replicas)

    def numbers(self) -> ClusterNumbers:
        for r in self.replicas:
            r.poll_metrics()
        snaps = [r.snap() for r in self.replicas]
        for s in snaps:
            if s.block_bytes is None and s.block_size:
                bpt = kv_bytes_per_token(self.tokenizer_folders, s.kv_dtype)
                s.block_bytes = bpt * s.block_size if bpt else None
        out = cluster_numbers(snaps)
        for g in out.shared:  # a prefix outside every replica's largest trees
            for r in self.replicas:
                if g.label_ids is not None:
                    break
                found = r.label(g.root_h64) if r.has_events else None
                if found is not None:
                    g.label_ids, g.salt = found
        return out
