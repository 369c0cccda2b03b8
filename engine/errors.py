"""Exception types shared by the KV-cache manager and the engine.

NoFreeBlocksError is an expected, recoverable condition (the scheduler preempts or waits), so it
carries numbers; KVCacheError means a caller bug and carries a message naming the sequence.
"""

from __future__ import annotations


class NoFreeBlocksError(RuntimeError):
    """Not enough KV blocks; raised before any state changes, so the caller may retry later."""

    def __init__(self, needed: int, available: int, what: str = ""):
        self.needed = needed
        self.available = available
        detail = f" for {what}" if what else ""
        super().__init__(f"need {needed} free KV blocks{detail}, only {available} can be freed")


class KVCacheError(RuntimeError):
    """Misuse: unknown, duplicate or double-freed sequence, or writing past max_model_len."""


class ModelLoadError(ValueError):
    """A model that cannot be served, said in plain words: a missing or unreadable path, a damaged
    or cut-short GGUF, an architecture or feature the engine cannot compute, a model too large for
    memory, a chat template that cannot be rendered (engine/exec/loader.py raises it)."""
