"""The engine's session table: the one owner of "which chat sessions exist and what they hold".

Why here: a chat session used to live in several places (the front's id cache, the manager's idle
pins, a session-id nulling trick to stop a running turn from parking, the UI's registry) and they
had to be kept in step by hand. Now this table owns a session's exact token ids and its life
cycle; the KV manager only holds the blocks of the sessions this table lets it park.

States (derived, never stored twice):
    running   a turn is in flight (its sequence owns the blocks)
    parked    no turn; the KV manager holds the session's block table under the owner handle
              this table gave it (`finish_turn`); the next turn reuses it at once. The manager
              may release parked blocks under memory pressure (it knows owners, not sessions):
              the handle then names nothing, and the next turn re-prefills
    released  no turn and no blocks (tab closed, memory pressure): the ids are kept, so the next
              turn rebuilds the same prompt and re-prefills it once
Operations: open (optionally with ids read back from storage after a restart), begin/finish turn
(the engine thread), fork (a new session starting from another's ids), release, close.
Thread-safety: callers read ids from any thread; writes come from the engine thread and the
front, so one lock guards the dict.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Session:
    token_ids: list[int]
    turn: str | None = None  # request id of the turn in flight
    keep_blocks: bool = True  # False after release/close during a turn: free, don't park
    parked_as: str | None = None  # the owner handle its blocks were last parked under


class SessionTable:
    def __init__(self):
        self._lock = threading.Lock()
        self._s: dict[str, _Session] = {}

    def open(self, session_id: str, token_ids: list[int] | None = None) -> None:
        """Create the session (no-op if it exists), or set its ids when given (restored turn)."""
        with self._lock:
            s = self._s.get(session_id)
            if s is None:
                self._s[session_id] = _Session(list(token_ids or []))
            elif token_ids is not None and s.turn is None:
                s.token_ids = list(token_ids)

    def token_ids(self, session_id: str) -> list[int] | None:
        """The exact ids of the session's last finished turn (prompt + reply), or None."""
        with self._lock:
            s = self._s.get(session_id)
            return list(s.token_ids) if s is not None and s.token_ids else None

    def begin_turn(self, session_id: str, request_id: str) -> str | None:
        """A turn starts; returns the owner handle its parked blocks are under (the turn's
        admission adopts them), or None."""
        with self._lock:
            s = self._s.setdefault(session_id, _Session([]))
            s.turn, s.keep_blocks = request_id, True
            handle, s.parked_as = s.parked_as, None
            return handle

    def finish_turn(
        self, session_id: str, request_id: str, token_ids: list[int] | None
    ) -> str | None:
        """A turn ended (engine thread). Records its ids when given; returns the owner handle to
        park its blocks under for the next turn, or None to free them (the session was released
        or closed meanwhile, or this is not the turn in flight)."""
        with self._lock:
            s = self._s.get(session_id)
            if s is None or s.turn != request_id:
                return None
            s.turn = None
            if token_ids:
                s.token_ids = list(token_ids)
            s.parked_as = session_id if s.keep_blocks else None
            return s.parked_as

    def release(self, session_id: str) -> str | None:
        """Give up the blocks, keep the ids; returns the owner handle the caller frees in the KV
        manager (None if nothing was parked). A turn in flight will free its blocks instead of
        parking them."""
        with self._lock:
            s = self._s.get(session_id)
            if s is None:
                return None
            if s.turn is not None:
                s.keep_blocks = False
            handle, s.parked_as = s.parked_as, None
            return handle

    def close(self, session_id: str) -> bool:
        """Forget the session (conversation deleted); a running turn will free, not park."""
        with self._lock:
            return self._s.pop(session_id, None) is not None

    def fork(self, src: str, dst: str) -> None:
        """`dst` starts from `src`'s ids (its blocks are shared through the prefix cache)."""
        with self._lock:
            ids = list(self._s[src].token_ids) if src in self._s else []
            self._s[dst] = _Session(ids)

    def running(self, session_id: str) -> str | None:
        with self._lock:
            s = self._s.get(session_id)
            return s.turn if s is not None else None

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._s

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._s)
