"""Drafts from the conversation itself: n-gram (prompt lookup) and suffix proposers.

Why this works for chat: a reply often repeats spans of what is already in front of the model: the
document it summarizes, the code it edits, a name or phrase it used two lines ago. If the last n
tokens occurred before, the tokens that followed them then are a good guess for what follows now.
Guessing costs a dictionary lookup; the model checks k guesses in one step (engine/core/speculation.py).

`NgramIndex` maps every n-gram (n in [min_n, max_n]) of one token list to the position right after
its most recent earlier occurrence. It is kept up to date incrementally (a few tuple inserts per
new token), so a proposal is O(max_n) whatever the context length. The longest matching n wins.

`SuffixHistory` ("--speculative suffix") adds the replies a tenant finished recently: when the
conversation itself has no match, the same lookup runs over them, and the draft is as long as the
match supports (a longer match earns a longer draft, as suffix decoding does). It is per tenant on
purpose: a draft drawn from another user's reply would make acceptance, and so timing, depend on
what that user wrote.
"""

from __future__ import annotations

from collections import OrderedDict, deque

MIN_N, MAX_N = 2, 4


class NgramIndex:
    """n-gram -> position after its latest occurrence, over one growing token list."""

    __slots__ = ("maps", "done", "min_n", "max_n")

    def __init__(self, min_n: int = MIN_N, max_n: int = MAX_N):
        self.min_n, self.max_n = min_n, max_n
        self.maps: dict[int, dict[tuple, int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.done = 0  # n-grams ending before this position are indexed

    def update(self, toks: list[int]) -> None:
        """Index the n-grams that end at positions [done, len - 1) (each has a continuation)."""
        end = len(toks) - 1
        for i in range(self.done, end):
            for n, m in self.maps.items():
                if i + 1 >= n:
                    m[tuple(toks[i + 1 - n : i + 1])] = i + 1
        self.done = max(self.done, end)

    def match(self, toks: list[int]) -> tuple[int, int]:
        """(continuation position, n) of the longest n-gram ending the list seen before, or (-1, 0)."""
        L = len(toks)
        for n in range(self.max_n, self.min_n - 1, -1):
            if L >= n:
                c = self.maps[n].get(tuple(toks[L - n :]))
                if c is not None:
                    return c, n
        return -1, 0

    def propose(self, toks: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the list's tail."""
        self.update(toks)
        c, _ = self.match(toks)
        return toks[c : c + k] if c >= 0 else []


class SuffixHistory:
    """A tenant's recently finished replies (prompt tail + reply), searchable like a conversation."""

    def __init__(self, max_tenants: int = 256, per_tenant: int = 32, max_tokens: int = 4096):
        self.per_tenant, self.max_tokens = per_tenant, max_tokens
        self.max_tenants = max_tenants
        self._hist: OrderedDict[str, deque] = OrderedDict()  # tenant -> deque[(tokens, NgramIndex)]

    def add(self, tenant: str, toks: list[int]) -> None:
        toks = list(toks[-self.max_tokens :])
        if len(toks) < MIN_N + 1:
            return
        idx = NgramIndex()
        idx.update(toks + [0])  # index every n-gram that has a continuation in toks
        q = self._hist.setdefault(tenant, deque(maxlen=self.per_tenant))
        self._hist.move_to_end(tenant)
        q.append((toks, idx))
        while len(self._hist) > self.max_tenants:
            self._hist.popitem(last=False)

    def propose(self, tenant: str, tail: list[int], k: int) -> list[int]:
        """The continuation of `tail`'s longest match in this tenant's newest replies; a match of n
        tokens earns up to n + 1 draft tokens (never more than k)."""
        best: tuple[int, list[int]] = (0, [])
        for toks, idx in reversed(self._hist.get(tenant, ())):
            c, n = idx.match(tail)
            if n > best[0]:
                best = (n, toks[c : c + min(k, n + 1)])
                if n == idx.max_n:
                    break
        return best[1]

    def forget(self, tenant: str) -> None:
        self._hist.pop(tenant, None)
