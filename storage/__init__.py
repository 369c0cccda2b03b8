"""Chat history storage (SQLite). The UI codes against ``Storage``; see store.py for the rules."""

from .errors import ConversationDeletedError, NotFoundError
from .store import Storage

__all__ = ["ConversationDeletedError", "NotFoundError", "Storage"]
