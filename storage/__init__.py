"""Chat history storage (SQLite). The UI codes against ``Storage``; see store.py for the rules."""

from .store import Storage

__all__ = ["Storage"]
