"""The engine's session table: the one owner of "which chat sessions exist and what they hold".

Why here: a chat session used to live in several places (the front's id cache, the manager's idle
pins, a session-id nulling trick to stop a running turn from parking, the UI's registry) and they
had to be kept in step by hand. Now this table owns a session's exact token ids and its life
cycle; the KV manager only holds the blocks of the sessions this table lets it park.

States (derived, never stored twice):
    running   a turn is in flight (its sequence owns the blocks)
    parked    no turn; the manager holds the session's block table (next turn reuses it at once)
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
    turn: str | None = None          # request id of the turn in flight
    keep_blocks: bool = True          # False after release/close during a turn: free, don't park


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

    def begin_turn(self, session_id: str, request_id: str) -> None:
        with self._lock:
            s = self._s.setdefault(session_id, _Session([]))
            s.turn, s.keep_blocks = request_id, True

    def finish_turn(self, session_id: str, request_id: str, token_ids: list[int] | None) -> bool:
        """A turn ended (engine thread). Records its ids when given; True if its blocks may be
        parked for the next turn (False when the session was released or closed meanwhile)."""
        with self._lock:
            s = self._s.get(session_id)
            if s is None or s.turn != request_id:
                return False
            s.turn = None
            if token_ids:
                s.token_ids = list(token_ids)
            return s.keep_blocks

    def release(self, session_id: str) -> None:
        """Give up the blocks, keep the ids. The caller frees a parked pin; a turn in flight will
        free its blocks instead of parking them."""
        with self._lock:
            s = self._s.get(session_id)
            if s is not None and s.turn is not None:
                s.keep_blocks = False

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
