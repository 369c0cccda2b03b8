"""How many leading token ids two lists share: the one helper every caller uses (the KV
manager's session reuse, the shared system prompt's length, the pinned system prefix).

Why its own file: the compare is the measure of what may be shared (KV blocks, the unsalted part
of a prompt), so it must give the same answer everywhere; a full match is one C-level compare,
the rare partial match a short loop.
"""

from __future__ import annotations


def common_prefix(a, b, limit: int | None = None) -> int:
    """Length of the common prefix of `a` and `b`, at most `limit` (default: the shorter one)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
