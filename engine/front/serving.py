"""`ServingLLM`: the serving face of the engine — what a chat server needs on top of the batch API.

Why a face of its own: `LLM` (engine/front/llm.py) is the vLLM-shaped batch API an offline user
needs (generate, chat, beam_search, submit). A server adds chat sessions whose blocks stay parked
between turns, pinned shared prompts, live snapshots of the pool for the Memory tab and /api/kv,
per-tenant rows for the fair scheduler, and load / queue figures read without waiting for a step.
Those live here, each a thin call onto their owner (the session table, the pin calls of
engine/front/pin_api.py, the snapshot cache, the fair policy), so neither face grows past what its
users need. The app (app.py), the UI, the routes and the tests of the product use this class; every
member they use is declared by a Protocol in engine/protocol.py.
"""

from __future__ import annotations

import time

from engine.core.tenancy import ReportsTenants
from engine.front import pin_api
from engine.front.engine_thread import SHUT_DOWN
from engine.front.llm import LLM
from engine.front.request_stream import RequestStream
from engine.kv.salt_rule import prompt_salt
from engine.observe.snapshot_cache import SharedSnapshot
from engine.sampling.sampling_params import SamplingParams
from engine.text.prepared_prompt import PreparedPrompt
from engine.text.session_prompt import continue_session_prompt

_SNAPSHOT_PERIOD_S = 0.25


class ServingLLM(LLM):
    """LLM + sessions, pins, snapshots, tenants and plain-read load figures (see the module)."""

    # published by the engine thread after each step (`_after_step`), read plainly by anyone; class
    # defaults so that the engine thread, started by LLM.__init__, never sees them missing
    _load: tuple[int, int] = (0, 0)  # (running, waiting) after the last step
    _waiting_ids: tuple[str, ...] = ()  # waiting request ids in admission order, same moment
    _tenant_rows: tuple = ((), ())  # (TenantStats rows, FairnessEvents)
    _tenant_rows_at = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._snapshots = SharedSnapshot(self.kv_snapshot, _SNAPSHOT_PERIOD_S)  # latest_snapshot*

    def _after_step(self, eng, idle: bool) -> None:
        """Engine thread, after each step: publish what plain reads (load, queue, tenants) return."""
        self._load = (len(eng.scheduler.running), len(eng.scheduler.waiting))
        self._publish_tenants(eng, force=idle)  # idle next: publish the final rows
        self._waiting_ids = (
            tuple(eng.scheduler.waiting_request_ids()) if eng.scheduler.waiting else ()
        )

    def _publish_tenants(self, eng, force: bool = False) -> None:
        """Every 0.5 s (engine thread): the fair policy's rows and events, for plain reads by the
        dashboard and /metrics that must not wait for a step to end. force: the loop is about to
        block with nothing to do, so these rows are the last ones until new work arrives — publish
        them now, or a burst that ended within 0.5 s of the last publish would read stale forever."""
        now = time.monotonic()
        if not force and now - self._tenant_rows_at < 0.5:
            return
        self._tenant_rows_at = now
        pol = eng.scheduler.policy
        if isinstance(pol, ReportsTenants):
            self._tenant_rows = (tuple(pol.tenant_stats()), tuple(pol.events()))

    def prepare_chat(
        self,
        messages: list[dict],
        *,
        previous_ids: list[int] | None = None,
        session_id: str | None = None,
        thinking: bool | None = None,
    ) -> PreparedPrompt:
        """Render and tokenize a chat turn's prompt once (engine/text/prepared_prompt.py): its
        length for a "too long" answer before anything is stored, and the ids `submit_chat` runs
        when handed this value. `previous_ids` / `session_id` / `thinking`: as for submit_chat."""
        previous = (
            previous_ids
            if previous_ids
            else (self.engine.sessions.token_ids(session_id) if session_id else None)
        )
        ids = continue_session_prompt(self.tokenizer, messages, previous, enable_thinking=thinking)
        return PreparedPrompt(tuple(messages), thinking, len(ids), tuple(ids), made_by=self)

    def submit_chat(
        self,
        messages: list[dict],
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        previous_ids: list[int] | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        thinking: bool | None = None,
        prepared: PreparedPrompt | None = None,
    ) -> RequestStream:
        """Chat turn. The previous turn's exact token ids are reused as the prefix: `previous_ids`
        when the caller kept them (e.g. read back from storage after a restart, or the branch being
        continued), else the session's last turn. They are used only if they decode to the start
        of the rendered conversation, so a wrong guess costs cache hits, never correctness.
        `cache_salt` (e.g. the user name under --auth): prefix-cache hits only between requests
        with the same salt, except for the leading system messages, shared by everyone.
        `thinking`: the template's enable_thinking switch (None: its default; ModelInfo.thinking_switch
        says whether it has one). `prepared`: this turn's prompt from prepare_chat; its ids run as
        they are, not rendered again (unless another engine made them: then they are)."""
        ids = prepared.ids_for(self, messages, thinking) if prepared is not None else None
        if ids is None:
            ids = list(
                self.prepare_chat(
                    messages, previous_ids=previous_ids, session_id=session_id, thinking=thinking
                ).token_ids
            )
        salt = prompt_salt(self.tokenizer, messages, ids, cache_salt)  # engine/kv/salt_rule.py
        return self.submit(
            {"prompt_token_ids": ids},
            params,
            session_id=session_id,
            request_id=request_id,
            cache_salt=salt,
            tenant=tenant,
            priority=priority,
        )

    def submit_continue(
        self,
        token_ids: list[int],
        params: SamplingParams | None,
        messages: list[dict],
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ) -> RequestStream:
        """Continue a reply: `token_ids` are its prompt's exact ids + the reply's own ids, so the
        session's parked blocks are reused and greedy decoding goes on exactly as if the reply had
        never stopped. `messages` (the conversation before the reply) only places the shared
        system-prompt boundary of the cache salt, as submit_chat does."""
        salt = prompt_salt(
            self.tokenizer, messages, list(token_ids), cache_salt
        )  # engine/kv/salt_rule.py
        return self.submit(
            {"prompt_token_ids": list(token_ids)},
            params,
            session_id=session_id,
            request_id=request_id,
            cache_salt=salt,
            tenant=tenant,
            priority=priority,
        )

    def open_session(self, session_id: str, token_ids: list[int] | None = None) -> None:
        """Declare a chat session, optionally with the exact ids of its last turn (prompt + reply)
        read back from storage after a restart; its next turn continues from them."""
        if token_ids is not None:
            self.engine.validate_prompt(list(token_ids) or [0])
        self.engine.sessions.open(session_id, token_ids)

    def session_token_ids(self, session_id: str) -> list[int] | None:
        """The exact ids the session's next turn continues from (None: no turn yet)."""
        return self.engine.sessions.token_ids(session_id)

    def end_session(self, session_id: str) -> bool:
        """Release a session's parked KV blocks (no tab shows it any more); its ids are kept."""
        return bool(self.run_on_engine(lambda eng: eng.release_session(session_id)))

    def close_session(self, session_id: str) -> bool:
        """Forget a session (its conversation was deleted): ids dropped, blocks released."""
        return bool(self.run_on_engine(lambda eng: eng.close_session(session_id)))

    def submit_beam_search(
        self,
        prompt,
        params,
        *,
        on_step=None,
        request_id: str | None = None,
        cache_salt=None,
        tenant: str | None = None,
        priority: int = 0,
    ):
        """One search, not waited for: a BeamSearchHandle (result() / await / abort()); on_step gets a
        BeamStepEvent per step in the engine thread (forks, frees, current beams) for live views.
        cache_salt, tenant, priority: as for submit (engine/kv/salt_rule.prompt_salt gives a chat's
        salt); the search counts against the tenant's queue bounds (QueueFull) until it starts."""
        from engine.front.beam_api import submit_beam_searches

        return submit_beam_searches(
            self,
            [prompt],
            params,
            on_step,
            [request_id] if request_id else None,
            cache_salt=cache_salt,
            tenant=tenant,
            priority=priority,
        )[0]

    def count_prompt_tokens(self, messages: list[dict], thinking: bool | None = None) -> int:
        """Length of the prompt these chat messages render to (no session reuse), for a
        "too long" answer before anything is stored or submitted."""
        return self.prepare_chat(messages, thinking=thinking).num_tokens

    def pin_prefix(self, name: str, token_ids: list[int]):
        """Prefill and pin token_ids' full blocks under name (never evicted); returns PinInfo."""
        return pin_api.pin_prefix(self, name, token_ids)

    def pin_system_prompt(self, name: str, text: str):
        """Pin the token prefix every chat with this system prompt starts with."""
        return pin_api.pin_prefix(self, name, self.system_prefix_ids(text))

    def system_prefix_ids(self, text: str) -> list[int]:
        return pin_api.system_prefix_ids(self.tokenizer, text)

    def check_pin(self, name: str, num_tokens: int) -> None:
        """Raise ValueError if pinning num_tokens under name would pass the pin cap."""
        self.run_on_engine(lambda eng: eng.pins.check_cap(name, num_tokens))

    def unpin(self, name: str) -> bool:
        return pin_api.unpin(self, name)

    def pins(self) -> list:
        return pin_api.pins(self)

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests as of the last step: a plain read, never waits for the engine
        thread (admission control in HTTP handlers must not cost a snapshot). Raises once shut down."""
        if self.engine_thread.closed:
            raise RuntimeError(SHUT_DOWN)
        return self._load

    def queue_position(self, request_id: str) -> int | None:
        """1-based place of `request_id` in the engine's waiting queue as of the last step, counting
        every waiting request (chat turns and API calls alike); None when it is not waiting (running,
        finished, or not yet taken in by the engine thread). A plain read, like `load()`."""
        try:
            return self._waiting_ids.index(request_id) + 1
        except ValueError:
            return None

    def tenant_stats(self, fresh: bool = False) -> list:
        """Per-tenant rows (engine.core.tenancy.TenantStats): counter, running / waiting, tokens, share
        of the last minute, preemptions suffered, queue time. Empty under FCFS. By default a plain
        read of what the engine thread published at most ~0.5 s ago; fresh=True waits for the
        current step to end and reads the policy itself."""
        return self._policy_rows(0, fresh)

    def fairness_events(self, fresh: bool = False) -> list:
        """Recent scheduler decisions (engine.core.tenancy.FairnessEvent): tenants held back, fair preemptions."""
        return self._policy_rows(1, fresh)

    def _policy_rows(self, which: int, fresh: bool) -> list:
        """The fair policy's rows (0) or events (1): as published, or read on the engine thread."""
        if not fresh:
            return list(self._tenant_rows[which])

        def read(eng):
            pol = eng.scheduler.policy
            if not isinstance(pol, ReportsTenants):
                return []
            return pol.tenant_stats() if which == 0 else pol.events()

        return self.run_on_engine(read)

    def kv_snapshot(self):
        """The snapshot contract, typed (engine/observe/kv_contract.KVSnapshot), taken between steps."""
        return self.run_on_engine(lambda eng: eng.kv_snapshot())

    def snapshot(self) -> dict:
        """Exact snapshot in its JSON form (the /api/kv format): taken between two steps, and
        serialized on the caller's thread, not the engine's."""
        return self.kv_snapshot().to_json()

    def latest_snapshot(self, compact: bool = False) -> dict:
        """A snapshot at most ~0.25 s old (longer when its forms are costly: engine/observe/snapshot_cache.py),
        shared by every caller in that window (dashboard ticks of many viewers cost one snapshot,
        one to_json per form). Taken on demand, never periodically by the engine. Read-only.
        Never waits behind a long step for more than ~0.2 s: then the previous window's is served.
        compact: the v4 compact form (no per-block lists)."""
        return self._snapshots.json(compact)

    def latest_snapshot_bytes(self, compact: bool = False) -> bytes:
        """latest_snapshot() as JSON bytes, serialized once per window for all viewers (/api/kv)."""
        return self._snapshots.body(compact)

    def set_snapshot_wait(self, max_wait_s: float) -> None:
        """How long a latest_snapshot* reader may wait for a due snapshot (default 0.2 s; a huge
        value waits for the engine's step boundary, as before issue 26: loadgen/bench_snapshot_burst.py)."""
        self._snapshots.max_wait_s = float(max_wait_s)
