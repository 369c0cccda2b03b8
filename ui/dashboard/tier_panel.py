"""The Memory tab's KV-tier panel: the second tier beside the pool, in numbers.

Why its own module: the tier (engine/kv/kv_tier.py) is its own concept, and the panel only reads the
snapshot's v5 stats (`tier_*`, swap counters), so it can be rendered, and tested, without the
rest of the dashboard. Rates (loads and write-backs per second) come from the difference of two
snapshots' counters, kept by `TierRates` (one per dashboard, fed once per snapshot time).
"""
from __future__ import annotations

from html import escape

from ui.dashboard.kv_math import fmt_bytes


class TierRates:
    """Per-second rates of the tier counters between the last two snapshots it saw."""
    KEYS = ("tier_hits_blocks", "tier_writebacks_blocks", "tier_writes_blocks", "tier_swapouts_blocks")

    def __init__(self):
        self._prev: tuple[float, dict] | None = None
        self._last: tuple[float, dict] | None = None
        self.rates = {k: 0.0 for k in self.KEYS}

    def update(self, t: float, stats: dict) -> dict:
        if self._last is not None and t == self._last[0]:
            return self.rates                      # same snapshot, another viewer
        self._prev, self._last = self._last, (t, {k: stats.get(k, 0) for k in self.KEYS})
        if self._prev is not None and self._last[0] > self._prev[0]:
            dt = self._last[0] - self._prev[0]
            self.rates = {k: max(0, self._last[1][k] - self._prev[1][k]) / dt for k in self.KEYS}
        return self.rates


def tier_html(st: dict, rates: dict) -> str:
    """Pool and tier side by side: blocks, bytes, hits per tier, loads / write-backs per second,
    swap-outs. Without a tier, one line saying so (and how to turn it on)."""
    bpb = st.get("kv_bytes_per_block", 0)
    pool_hits = max(0, st.get("prefix_cache_hits", 0) - st.get("tier_loaded_tokens", 0))
    if not st.get("tier_kind"):
        return ('<div class="kv-tier"><b>KV tier:</b> off (start the app with <code>--kv-offload-gib'
                '</code> to keep evicted and parked blocks on disk instead of recomputing them)</div>')
    kind = "disk" if st["tier_kind"] == "disk" else "host memory"
    used = st.get("tier_bytes", 0)
    cap = st.get("tier_capacity_bytes", 0) or 1
    rows = [
        ("blocks", f"{st['used_blocks']:,} used / {st['total_blocks']:,}",
         f"{st.get('tier_blocks', 0):,}"),
        ("bytes", fmt_bytes(st["used_blocks"] * bpb) + " / " + fmt_bytes(st["total_blocks"] * bpb),
         f"{fmt_bytes(used)} / {fmt_bytes(cap)} ({used / cap:.0%})"),
        ("hits (tokens)", f"{pool_hits:,}", f"{st.get('tier_loaded_tokens', 0):,}"),
        ("loads / s", "", f"{rates.get('tier_hits_blocks', 0):.1f} blocks"),
        ("write-backs / s", "", f"{rates.get('tier_writebacks_blocks', 0):.1f} blocks"),
        ("swap-outs", "", f"{st.get('swap_preemptions', 0):,} preemptions, "
                          f"{st.get('tokens_swapped_out', 0):,} tokens"),
        ("restored at start", "", f"{st.get('tier_restored_blocks', 0):,} blocks"),
        ("dropped (checksum)", "", f"{st.get('tier_dropped_corrupt', 0):,}"),
    ]
    body = "".join(f"<tr><th>{escape(a)}</th><td>{escape(b)}</td><td>{escape(c)}</td></tr>" for a, b, c in rows)
    return (f'<div class="kv-tier"><table class="kv-tier-table"><thead><tr><th></th><th>pool</th>'
            f'<th>KV tier ({escape(kind)})</th></tr></thead><tbody>{body}</tbody></table></div>')
