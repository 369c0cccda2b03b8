"""Building the second KV tier for an engine: which store, where, how big, under which fingerprint.

Why separate from engine/kv/tier/store.py: that module is the store and index and knows nothing about
torch, devices or the app's folders; this one makes the start-up decisions:
- `kv_offload_gib` None or 0: no tier. "auto" (the app's default): on CPU a file store of
  min(8 GiB, 10% of the free disk) under the app's cache folder (<cache>/kv-tier/<fingerprint>);
  on CUDA host memory of a quarter of the available RAM. A number: that many GiB.
- The folder is per fingerprint, so a tier written for another model or KV layout is never read.
"""

from __future__ import annotations

import logging
import os
import shutil

from engine.kv.tier.store import FileStore, KVTier, MemoryStore
from engine.kv.tier.file_io import PoolSlabIO, model_fingerprint

log = logging.getLogger("paged_chat.engine")
ENV_DIR = "PAGED_CHAT_KV_OFFLOAD_DIR"  # overrides the default folder (tests, several apps)


def default_dir() -> str:
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    from engine.config import cache_root

    return str(cache_root() / "kv-tier")


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


def resolve_capacity(gib, device: str, folder: str) -> int:
    """Bytes for the tier (0: off)."""
    if gib is None:
        return 0
    if gib == "auto":
        if device.startswith("cuda"):
            return _available_ram() // 4
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return int(min(8 * 2**30, shutil.disk_usage(folder).free * 0.10))
    gib = float(gib)
    if gib < 0:
        raise ValueError(f"kv_offload_gib must be >= 0 or 'auto', got {gib}")
    return int(gib * 2**30)


def build_tier(
    kv,
    kv_pool,
    weights: dict,
    *,
    kv_rotation,
    gib,
    folder: str | None,
    device: str,
    dtype: str,
    state_io=None,
):
    """Attach a tier to the manager `kv` when asked for; returns its link (engine/kv/tier/link.py)
    or None. Built from values (the pool tensor, its rotation, the weights), not from the runner.
    state_io: a linear-attention model's state slots (slot_bytes, slot_nbytes, layout()): its
    states go to the tier with the blocks (engine/kv/tier/state_entries.py), its layout into the
    fingerprint."""
    if gib is None or gib == 0 or not kv.enable_prefix_caching:
        return None
    folder = folder or default_dir()
    cap = resolve_capacity(gib, device, folder)
    if cap <= 0:
        return None
    io = PoolSlabIO(kv_pool)
    fp = model_fingerprint(
        weights,
        dtype=dtype,
        kv_pool=kv_pool,
        block_size=kv.block_size,
        kv_rotation=kv_rotation,
        groups=kv.layout.fingerprint(),
        states=state_io.layout() if state_io is not None else "",
    )
    if device.startswith("cuda"):
        store, kind = MemoryStore(), "host"
    else:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        store, kind = FileStore(os.path.join(folder, fp)), "disk"
    tier = KVTier(store, fp, max(cap, io.nbytes), kind=kind)
    link = kv.attach_tier(tier, io, state_io=state_io)
    log.info(
        "KV tier: %s, %.2f GiB, %d blocks restored (fingerprint %s)",
        kind,
        cap / 2**30,
        tier.restored,
        fp,
    )
    return link
