"""The Memory tab's KV-tier panel: the second tier beside the pool, in numbers.

Why its own module: the tier (engine/kv/tier/store.py) is its own concept, and the panel only reads the
snapshot's v5 stats (`tier_*`, swap counters), so it can be rendered, and tested, without the
rest of the dashboard. Rates (loads and write-backs per second) come from the difference of two
snapshots' counters, kept by `TierRates` (one per dashboard, fed once per snapshot time).
"""

from __future__ import annotations

from html import escape

from ui.dashboard.kv_math import fmt_bytes


class TierRates:
    """Per-second rates of the tier counters between the last two snapshots it saw."""

    KEYS = (
        "tier_hits_blocks",
        "tier_writebacks_blocks",
        "tier_writes_blocks",
        "tier_swapouts_blocks",
    )

    def __init__(self):
        self._prev: tuple[float, dict] | None = None
        self._last: tuple[float, dict] | None = None
        self.rates = {k: 0.0 for k in self.KEYS}

    def update(self, t: float, stats: dict) -> dict:
        if self._last is not None and t == self._last[0]:
            return self.rates  # same snapshot, another viewer
        self._prev, self._last = self._last, (t, {k: stats.get(k, 0) for k in self.KEYS})
        if self._prev is not None and self._last[0] > self._prev[0]:
            dt = self._last[0] - self._prev[0]
            self.rates = {k: max(0, self._last[1][k] - self._prev[1][k]) / dt for k in self.KEYS}
        return self.rates


# one line on hover for each row (issue 47: "write-backs / s", "dropped (checksum)" were unexplained)
ROWS_TIPS = {
    "hits": "Prompt tokens reused instead of computed: from blocks still in the pool, and from blocks "
    "loaded back from the tier",
    "loads / s": "Blocks read back from the tier per second (a prompt whose prefix left the pool)",
    "write-backs / s": "Blocks written to the tier per second as the pool evicts them, so they can come back later",
    "swap-outs": "Replies paused for memory whose blocks were written to the tier instead of dropped",
    "restored at start": "Blocks found in the tier when the app started (kept from the last run)",
    "dropped (checksum)": "Tier entries thrown away because their bytes failed the integrity check "
    "(a torn or damaged file); those tokens are computed again",
}


def tier_html(st: dict, rates: dict) -> str:
    """The second tier in a few rows beside the pool: what it holds, hits from each, loads and
    write-backs per second, swap-outs. Without a tier, one line saying so (and how to turn it on)."""
    pool_hits = max(0, st.get("prefix_cache_hits", 0) - st.get("tier_loaded_tokens", 0))
    if not st.get("tier_kind"):
        return (
            '<div class="kv-tier kvd"><h4>KV tier</h4><div class="muted">Off (start the app with '
            '<code>--kv-offload-gib</code> to keep evicted and parked blocks on disk instead of '
            'recomputing them).</div></div>'
        )
    kind = "disk" if st["tier_kind"] == "disk" else "host memory"
    used = st.get("tier_bytes", 0)
    cap = st.get("tier_capacity_bytes", 0) or 1
    rows = [
        (
            "hits",
            f"{pool_hits:,} tokens from the pool · {st.get('tier_loaded_tokens', 0):,} from the tier",
        ),
        ("loads / s", f"{rates.get('tier_hits_blocks', 0):.1f} blocks"),
        ("write-backs / s", f"{rates.get('tier_writebacks_blocks', 0):.1f} blocks"),
        (
            "swap-outs",
            f"{st.get('swap_preemptions', 0):,} replies, {st.get('tokens_swapped_out', 0):,} tokens",
        ),
        ("restored at start", f"{st.get('tier_restored_blocks', 0):,} blocks"),
        ("dropped (checksum)", f"{st.get('tier_dropped_corrupt', 0):,}"),
    ]
    body = "".join(
        f'<tr title="{escape(ROWS_TIPS[a], quote=True)}"><th>{escape(a)}</th><td>{escape(b)}</td></tr>'
        for a, b in rows
    )
    return (
        f'<div class="kv-tier kvd"><h4>KV tier ({escape(kind)})</h4>'
        f'<div class="muted">{st.get("tier_blocks", 0):,} blocks, {fmt_bytes(used)} of {fmt_bytes(cap)} '
        f'({used / cap:.0%}), beside the pool\'s {st["used_blocks"]:,} used of {st["total_blocks"]:,}</div>'
        f'<div class="scroll"><table class="kv-tier-table"><tbody>{body}</tbody></table></div></div>'
    )
