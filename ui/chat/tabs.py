"""Per-tab state kept on the server, keyed by Gradio's session_hash (one per browser tab or API
client), and the rule that ties engine sessions to it.

This is the one place that maps tabs to conversations (`Tab.conv_id`), and conversations to the
reply generating in them (`turn(conv_id)`, the "busy" set). Every open conversation is a live
engine session (session_id = conversation id). Its KV blocks are released (ids kept) when the
last tab showing it moves away or closes, and the session is closed when the conversation is
deleted — but never while a reply is being generated; then the turn's own `finally` releases it.
Engine calls (abort, end_session) run on one worker thread, in submission order, so an abort
is always processed before the release that follows it and no handler blocks the event loop.
"""

from __future__ import annotations

import hmac
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.protocol import ReportsQueuePosition


def in_daemon_thread(fn, *args, **kwargs) -> Future:
    """Run one blocking engine call off the event loop. A daemon thread: a call that can never
    complete (engine stopped under it) must not keep the process alive at exit."""
    fut: Future = Future()

    def run():
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # delivered to whoever awaits the future
                fut.set_exception(e)

    threading.Thread(target=run, daemon=True, name="chat-engine-call").start()
    return fut


class SerialWorker:
    """One daemon thread running jobs in submission order (abort before release, always)."""

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        self._q.put((fut, fn, args))
        return fut

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:
                    fut.set_exception(e)

    def shutdown(self, timeout: float | None = None) -> bool:
        """Run what is queued, then stop; False if that did not finish within `timeout`."""
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


@dataclass
class Tab:
    session_hash: str
    username: str | None = None
    conv_id: str | None = None
    shown_ids: list[int] = field(default_factory=list)  # stored message id of each chatbot row
    view_sig: tuple = ()  # what the chatbot shows (to repaint on change)
    list_sig: tuple = ()  # what the conversation list shows
    model_seen: str | None = None  # the served model this tab's header names
    meter_sig: tuple = ()  # the context meter as last sent (ui/events.py)
    following: object = None  # the Turn / BeamTurn this tab is painting (has a `wakeup`), if any
    alt_ids: list[int] = field(default_factory=list)  # stored ids of the alternatives on screen
    attachments: list = field(
        default_factory=list
    )  # documents for the next message (ui/chat/documents.py)
    # its goodbye (ui/chat/tab_goodbye.py): a secret only its page holds, when it was last heard
    # from, and whether the sweep released its chat for silence (it is re-attached when it speaks)
    goodbye: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    seen: float = field(default_factory=time.monotonic)
    dormant: bool = False


RELEASE_GRACE_S = 5.0  # the app's: a closed tab's chat keeps its blocks this long ("parked")


class TabRegistry:
    """`release_grace_s`: how long a conversation whose last tab closed (unload) keeps its blocks
    before they are released. Why: a reload is an unload followed by a load of the same chat; with
    no grace the reloaded chat lost its blocks and was no longer a live session (issue 26.6). An
    explicit goodbye (API close_tab) and switching chats release at once."""

    def __init__(self, llm, release_grace_s: float = 0.0):
        self.release_grace_s = release_grace_s
        self._parked: dict[str, float] = {}  # conversation id -> release deadline
        self._llm = llm
        self._lock = threading.Lock()
        self._tabs: dict[str, Tab] = {}
        self._viewers: dict[str, set[str]] = {}  # conversation id -> session hashes
        self._busy: set[str] = set()  # conversations generating right now
        self._turns: dict[str, object] = {}  # conversation id -> its running Turn
        # conversation id -> the stored message its engine session's tokens end with (the meter)
        self._leaves: dict[str, int] = {}
        self._jobs = SerialWorker("kv-release")

    # ---- tabs ----------------------------------------------------------------------------
    def get(self, session_hash: str, username: str | None = None) -> Tab:
        with self._lock:
            tab = self._tabs.get(session_hash)
            if tab is None:
                tab = self._tabs[session_hash] = Tab(session_hash, username)
            tab.seen = time.monotonic()
            if tab.dormant:  # swept for silence, yet alive: it shows its chat again
                tab.dormant = False
                if tab.conv_id is not None:
                    self._viewers.setdefault(tab.conv_id, set()).add(session_hash)
                    self._parked.pop(tab.conv_id, None)
            return tab

    def goodbye(self, session_hash: str, token: str, username: str | None = None) -> bool:
        """The page said it is going away (ui/chat/tab_goodbye.py): closed as an unload (parked
        first), if the secret is that tab's own and the login (None without --auth) its owner's."""
        with self._lock:
            tab = self._tabs.get(session_hash)
            ok = (
                tab is not None
                and hmac.compare_digest(tab.goodbye.encode(), str(token).encode())
                and (tab.username or None) == (username or None)
            )
        if ok:
            self.close(session_hash, grace=True)
        return ok

    def sweep(self, silent_s: float, forget_s: float = 86400.0) -> int:
        """Tabs not heard from for `silent_s` (a crashed browser, a lost network: no goodbye came)
        release their chat as if closed (parked first) but stay known, dormant, so a tab that was
        only asleep continues its chat; dormant ones silent for `forget_s` are forgotten. Returns
        how many went dormant."""
        now, went = time.monotonic(), []
        with self._lock:
            for sh, tab in list(self._tabs.items()):
                if tab.dormant and now - tab.seen > forget_s:
                    del self._tabs[sh]
                elif not tab.dormant and now - tab.seen > silent_s:
                    tab.dormant = True
                    went.append((sh, tab.conv_id))
        for sh, conv in went:
            self._park(sh, conv)
        return len(went)

    def owner_of(self, session_hash: str) -> str | None:
        """The user who opened this tab (None: no such tab, or no login) - for guards."""
        with self._lock:
            tab = self._tabs.get(session_hash)
            return tab.username if tab is not None else None

    def open(self, tab: Tab, conv_id: str | None) -> None:
        """Show `conv_id` in `tab` (None: a fresh, not yet created chat)."""
        release = None
        with self._lock:
            old = tab.conv_id
            if old == conv_id:
                return
            if old is not None:
                release = self._leave(tab.session_hash, old)
            tab.conv_id = conv_id
            tab.shown_ids = []
            following = tab.following
            if conv_id is not None:
                self._viewers.setdefault(conv_id, set()).add(tab.session_hash)
                self._parked.pop(conv_id, None)  # reopened in time: it stays live
        if following is not None:  # its painter stops at once (ui/chat/wakeup.py)
            following.wakeup.wake()
        if release:
            self.release(release)

    def close(self, session_hash: str, grace: bool = False) -> None:
        """The tab closed (its page's goodbye, grace=True: the chat is parked for release_grace_s
        first) or the API client said goodbye (released at once)."""
        with self._lock:
            tab = self._tabs.pop(session_hash, None)
        if tab is not None:
            self._park(session_hash, tab.conv_id, grace)

    def _park(self, session_hash: str, conv_id: str | None, grace: bool = True) -> None:
        """`session_hash` no longer shows `conv_id`: released when no tab shows it (after
        release_grace_s with `grace`), unless a reply is generating in it."""
        release = None
        with self._lock:
            if conv_id is not None:
                release = self._leave(session_hash, conv_id)
            if release and grace and self.release_grace_s > 0:
                self._parked[release] = time.monotonic() + self.release_grace_s
                timer = threading.Timer(self.release_grace_s, self._release_parked, (release,))
                timer.daemon = True
                timer.start()
                release = None
        if release:
            self.release(release)

    def _release_parked(self, conv_id: str) -> None:
        with self._lock:
            if conv_id not in self._parked or self._viewers.get(conv_id) or conv_id in self._busy:
                self._parked.pop(conv_id, None)
                return
            del self._parked[conv_id]
        self.release(conv_id)

    def chat_states(self) -> dict[str, str]:
        """What each conversation the tabs know of is now: "generating" (a reply runs, watched or
        not), "open" (a tab shows it; its session keeps its blocks between turns) or "parked" (its
        last tab closed moments ago; released after release_grace_s unless reopened). Whether an
        open chat still holds blocks is the engine's to say (the Memory tab reads its snapshot)."""
        with self._lock:
            out = {c: "parked" for c in self._parked}
            out.update({c: "open" for c, v in self._viewers.items() if v})
            out.update({c: "generating" for c in self._busy})
            return out

    def _leave(self, session_hash: str, conv_id: str) -> str | None:
        viewers = self._viewers.get(conv_id)
        if viewers is not None:
            viewers.discard(session_hash)
            if viewers:
                return None
            del self._viewers[conv_id]
        return None if conv_id in self._busy else conv_id

    def forget(self, conv_id: str) -> Future:
        """The conversation was deleted: detach every tab showing it; the engine forgets the
        session (ids and blocks)."""
        with self._lock:
            for sh in self._viewers.pop(conv_id, set()):
                tab = self._tabs.get(sh)
                if tab is not None and tab.conv_id == conv_id:
                    tab.conv_id, tab.shown_ids = None, []
        return self._jobs.submit(self._close_job, conv_id)

    def _close_job(self, conv_id: str) -> None:
        try:
            self._llm.close_session(conv_id)
        except RuntimeError:  # the engine is shutting down
            pass

    # ---- generations ------------------------------------------------------------------------
    def begin(self, conv_id: str) -> bool:
        """Mark a conversation as generating; False if another tab is already generating in it."""
        with self._lock:
            if conv_id in self._busy:
                return False
            self._busy.add(conv_id)
            return True

    def attach(self, turn) -> None:
        """The turn generating in turn.conv_id (after begin): every tab showing it can follow it."""
        with self._lock:
            self._turns[turn.conv_id] = turn

    def queue_position(self, turn) -> int:
        """Where `turn`'s request waits in the engine's queue, counting every waiting request (API
        calls too, not only chat replies): the engine's own answer. Before the engine thread has
        taken the request in, it will join behind everything waiting now. A backend that cannot say
        (a remote server) gets the chat turns submitted before this one that still wait."""
        if isinstance(self._llm, ReportsQueuePosition):
            try:
                pos = self._llm.queue_position(turn.rid)
                return pos if pos is not None else self._llm.load()[1] + 1
            except RuntimeError:  # the engine is shutting down: fall back to what we know
                pass
        with self._lock:
            ahead = [t for t in self._turns.values() if not t.admitted and t.created < turn.created]
        return 1 + len(ahead)

    def held_by_session(self, conv_id: str, message_id: int | None) -> None:
        """The conversation's engine session now holds the branch through `message_id` (a turn
        ended); the context meter tells it from the version on screen."""
        with self._lock:
            if message_id is None:
                self._leaves.pop(conv_id, None)
            else:
                self._leaves[conv_id] = message_id
                while len(self._leaves) > 4096:
                    self._leaves.pop(next(iter(self._leaves)))

    def session_leaf(self, conv_id: str) -> int | None:
        with self._lock:
            return self._leaves.get(conv_id)

    def turn(self, conv_id: str | None):
        """The running Turn of a conversation, or None."""
        with self._lock:
            return self._turns.get(conv_id) if conv_id is not None else None

    def end(
        self,
        conv_id: str,
        abort_request_id: str | None = None,
        submitted: Future | None = None,
        turn=None,
    ) -> Future:
        """The generation is over: abort its request if still running, release if nobody shows it.

        `submitted` is the (possibly still running) submit call: the abort waits for it, so a
        handler cancelled while its request was being queued cannot leave that request behind.
        """
        with self._lock:
            self._busy.discard(conv_id)
            if turn is None or self._turns.get(conv_id) is turn:
                self._turns.pop(conv_id, None)
            orphan = conv_id not in self._viewers
        return self._jobs.submit(
            self._finish_job, abort_request_id, conv_id if orphan else None, submitted
        )

    def _finish_job(
        self, request_id: str | None, conv_id: str | None, submitted: Future | None = None
    ) -> None:
        try:
            if submitted is not None:
                try:
                    submitted.result(timeout=60)
                except Exception:  # bad input or no engine: there is no request to abort
                    request_id = None
            if request_id is not None:
                self._llm.abort(request_id)
            if conv_id is not None:
                self._llm.end_session(conv_id)
        except RuntimeError:  # the engine is shutting down: nothing left to release
            pass

    def abort(self, request_id: str, submitted: Future | None = None) -> Future:
        return self._jobs.submit(self._finish_job, request_id, None, submitted)

    def release(self, conv_id: str) -> Future:
        return self._jobs.submit(self._finish_job, None, conv_id)

    # ---- introspection (tests, status line) -------------------------------------------------
    def open_conversations(self) -> dict[str, int]:
        with self._lock:
            return {c: len(v) for c, v in self._viewers.items()}

    def is_watched(self, conv_id: str) -> bool:
        """Some tab shows this conversation now (the reply idle timeout counts from when none does)."""
        with self._lock:
            return bool(self._viewers.get(conv_id))

    def is_busy(self, conv_id: str) -> bool:
        with self._lock:
            return conv_id in self._busy

    def abort_all(self) -> None:
        """Server shutting down: end every reply in flight (each handler then stores it as stopped)."""
        with self._lock:
            turns = list(self._turns.values())
        for turn in turns:
            self.abort(turn.rid, turn.submitted)

    def shutdown(self, timeout: float | None = 10) -> bool:
        return self._jobs.shutdown(timeout)
