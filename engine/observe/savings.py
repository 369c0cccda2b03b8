"""What sharing saves, read from a snapshot's stats contract (engine/observe/kv_contract.py).

Why here: both the Memory tab's headline (ui/dashboard/view.py) and /metrics (routes/metrics.py)
report it, and routes must not import ui; it is a pure function of the snapshot's JSON.
"""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens (ceiling division)."""
    return -(-int(tokens) // block_size)


def sharing_savings(snap: dict) -> dict:
    """Blocks saved by sharing, read from the engine's stats contract: logical blocks (every
    table entry; what an unshared pager allocates) - used blocks. Not recomputed here."""
    st = snap["stats"]
    total_refs, used = st["logical_blocks"], st.get("chat_used_blocks", st["used_blocks"])
    saved = st.get("saved_blocks", max(0, total_refs - used))  # the contract's definition (v8)
    live = st["num_sequences"] + st["num_idle_sessions"]
    contiguous = (
        live * blocks_for(st["max_model_len"], st["block_size"]) if "max_model_len" in st else None
    )
    return {
        "ref_sum": total_refs,
        "used_blocks": used,
        "saved_blocks": saved,
        "saved_bytes": saved * st["kv_bytes_per_block"],
        "unshared_blocks": st["logical_blocks"],
        "contiguous_blocks": contiguous,
    }
