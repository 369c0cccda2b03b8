"""The tier's view of the pool tensor: one block's slab as bytes, and the model fingerprint.

A block is exactly kv_pool[:, :, block_id] (K and V, every layer slot of its KV cache group,
every slot, every KV head, one row each) "as the pool holds it": whatever the pool's dtype says the row format is (fp32, bf16,
or 1-byte codes + a scale), the bytes go out and come back unchanged, so a loaded block is
bit-identical to the evicted one. The fingerprint names everything that must match for those
bytes to mean the same KV: a sample of the weights, the compute and KV dtypes, the block size,
the pool's shape per block, and the engine's KV layout version.
"""

from __future__ import annotations

import hashlib

import torch

from engine.kv.tier.store import LAYOUT_VERSION


class PoolSlabIO:
    """read(block_id) -> bytes and write(block_id, bytes) over the one pool tensor."""

    def __init__(self, kv_pool: torch.Tensor):
        self.kv_pool = kv_pool
        slab = kv_pool[:, :, 0]
        self.slab_shape = tuple(slab.shape)
        self.nbytes = slab.numel() * slab.element_size()

    def read(self, block_id: int) -> bytes:
        slab = self.kv_pool[:, :, block_id].contiguous()
        if slab.device.type != "cpu":
            slab = slab.cpu()
        return slab.view(torch.uint8).numpy().tobytes()

    def write(self, block_id: int, data: bytes) -> None:
        if len(data) != self.nbytes:
            raise ValueError(f"a block is {self.nbytes} bytes, got {len(data)}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        src = raw.view(self.kv_pool.dtype).view(self.slab_shape)
        self.kv_pool[:, :, block_id].copy_(src.to(self.kv_pool.device, non_blocking=False))


def model_fingerprint(
    weights: dict,
    *,
    dtype,
    kv_pool: torch.Tensor,
    block_size: int,
    kv_rotation: str = "none",
    groups: str = "",
    states: str = "",
    sample_bytes: int = 1 << 16,
) -> str:
    """A short hex digest of what the KV depends on. Weights: every tensor's name, shape and
    dtype, and up to `sample_bytes` bytes from its start and end (hashing 0.5-15 GB of weights
    at every start-up would cost seconds; a sample still tells two checkpoints apart). `groups`:
    the KV cache group layout (engine/kv/cache_spec.KVCacheLayout.fingerprint; "" for one
    full-attention group, so the files of a model without groups keep their folder). `states`: a
    linear-attention model's state slot layout (engine/exec/models/linear_state.LinearState.layout;
    "" for every other model), so a state is never read under another layout."""
    h = hashlib.blake2b(digest_size=12)
    h.update(
        f"layout={LAYOUT_VERSION};dtype={dtype};kv={kv_pool.dtype};rot={kv_rotation};bs={block_size};"
        f"slab={tuple(kv_pool[:, :, 0].shape)}{groups}"
        f"{';states=' + states if states else ''}".encode()
    )
    for name in sorted(weights):
        t = weights[name]
        if not isinstance(t, torch.Tensor):
            h.update(f"{name}:{type(t).__name__}".encode())
            continue
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        flat = t.detach().reshape(-1)
        if flat.numel() == 0:
            continue
        k = max(1, sample_bytes // max(1, flat.element_size()))
        for part in (flat[:k], flat[-k:]):
            part = part.contiguous().cpu()
            h.update(
                part.view(torch.uint8).numpy().tobytes()
                if part.dtype != torch.bool
                else part.numpy().tobytes()
            )
    return h.hexdigest()
