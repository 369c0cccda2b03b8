"""Storage errors the UI can show as they are.

KeyError subclasses, so callers that already treat unknown ids as KeyError keep working, but
with a readable str() (a bare KeyError prints its message in quotes) and a distinct type for the
case a user must be told about: the conversation vanished while this process was writing to it,
typically because another window or another server process on the same database deleted it.
"""

from __future__ import annotations

import functools
import sqlite3


class NotFoundError(KeyError):
    """An id that does not exist (or no longer exists)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class ConversationDeletedError(NotFoundError):
    """A write hit a conversation or message that was deleted meanwhile; nothing was stored."""

    def __init__(self, detail: str = ""):
        msg = (
            "This conversation was deleted (perhaps in another window or by another process "
            "using the same database), so this change could not be saved."
        )
        super().__init__(msg + (f" [{detail}]" if detail else ""))


def write_to_existing(method):
    """Turn 'row vanished' failures of a write into ConversationDeletedError.

    Covers the id lookups (KeyError) and the race where another process deletes between our
    check and our INSERT (the foreign key then fails)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ConversationDeletedError:
            raise
        except KeyError as e:
            raise ConversationDeletedError(str(e.args[0]) if e.args else "") from e
        except sqlite3.IntegrityError as e:
            if "FOREIGN KEY" not in str(e).upper():
                raise
            raise ConversationDeletedError(str(e)) from e

    return wrapper
