"""The public face: `LLM` (vLLM-shaped batch API) plus a thread-safe streaming front.

One background thread owns the engine (model + pool) and runs steps while there is work
(`EngineThread`, engine/front/engine_thread.py). Callers in any thread submit requests and read
deltas from a `RequestStream` (sync iteration, or `async for` in an asyncio handler); everything
else that must touch the engine runs on that thread through `run_on_engine`.
"""
from __future__ import annotations

import itertools
import threading
import time

from engine.front import pin_api
from engine.core.admission import AdmissionControl, QueueBounds
from engine.core.tenancy import LOCAL_TENANT, ReportsTenants
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.exec.loader import load_model
from engine.exec.model_info import ModelInfo, build_model_info
from engine.outputs import RequestOutput
from engine.sampling.sampling_params import SamplingParams
from engine.front.engine_thread import SHUT_DOWN, EngineThread
from engine.front.request_stream import RequestStream, collect
from engine.core.sequence import Request, RequestOutputDelta
from engine.kv.salt_rule import prompt_salt
from engine.text.session_prompt import continue_session_prompt
from engine.observe.snapshot_cache import SharedSnapshot

_SNAPSHOT_PERIOD_S = 0.25


class LLM:
    kind = "local"                          # engine.protocol.ChatEngine: the engine runs in this process

    def __init__(self, model: str | None = None, block_size: int = 16, num_blocks: int | None = None,
                 kv_cache_gib: float | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int | None = None, device: str | None = None,
                 dtype: str | None = None, seed: int = 0, attention_backend: str = "auto",
                 enable_prefix_caching: bool = True, progress=None, load_format: str = "auto",
                 enforce_eager: bool = False, hf_overrides: dict | None = None,
                 max_pin_fraction: float | None = None, quantization: str | None = None,
                 kv_cache_dtype: str = "auto", kv_cache_rotation: str = "auto",
                 scheduling_policy: str = "fair", tenant_weights: dict[str, float] | None = None,
                 queue_bounds: QueueBounds | None = None,
                 kv_offload_gib: float | str | None = None, kv_offload_dir: str | None = None,
                 speculative: str | None = None, num_speculative_tokens: int = 5,
                 speculative_adaptive: bool = True, lean_step: str = "auto"):
        cfg = EngineConfig(model=model, block_size=block_size, num_blocks=num_blocks,
                           kv_cache_gib=kv_cache_gib, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, device=device, dtype=dtype,
                           seed=seed, attention_backend=attention_backend,
                           enable_prefix_caching=enable_prefix_caching, load_format=load_format,
                           enforce_eager=enforce_eager, quantization=quantization,
                           kv_cache_dtype=kv_cache_dtype, kv_cache_rotation=kv_cache_rotation,
                           scheduling_policy=scheduling_policy,
                           kv_offload_gib=kv_offload_gib, kv_offload_dir=kv_offload_dir,
                           speculative=speculative, num_speculative_tokens=num_speculative_tokens,
                           speculative_adaptive=speculative_adaptive, lean_step=lean_step,
                           **({} if max_pin_fraction is None else {"max_pin_fraction": float(max_pin_fraction)}))
        if hf_overrides and load_format != "dummy":
            raise ValueError("hf_overrides is only used with load_format='dummy'")
        dummy_kw = dict(seed=seed, device=cfg.device, dtype=cfg.torch_dtype, hf_overrides=hf_overrides) \
            if load_format == "dummy" else {}
        loaded = load_model(model, progress=progress, load_format=load_format, **dummy_kw)
        self.config = cfg
        self.model_source = loaded.source
        self.hf_folder = loaded.hf_folder
        self.engine = LLMEngine(cfg, loaded, tenant_weights)
        self.admission = AdmissionControl(queue_bounds)   # queued-request bounds (engine/core/admission.py)
        self.tokenizer = loaded.tokenizer
        self._info = build_model_info(loaded.source, loaded.config, cfg, self.engine.runner, self.engine.eos_ids)
        self._ids = itertools.count()
        self._live: set[str] = set()                 # request ids not yet finished
        self._live_lock = threading.Lock()
        self._snapshots = SharedSnapshot(self.kv_snapshot, _SNAPSHOT_PERIOD_S)   # latest_snapshot*
        self._load = (0, 0)                          # (running, waiting) after the last step
        self._waiting_ids: tuple[str, ...] = ()      # waiting request ids in admission order, same moment
        self._tenant_rows: tuple = ((), ())          # (TenantStats rows, FairnessEvents), published by the loop
        self._tenant_rows_at = 0.0
        # the one owner of the engine from here on (engine/front/engine_thread.py)
        self.engine_thread = EngineThread(self.engine, after_step=self._publish)

    # ---- published by the engine thread, read plainly by anyone ---------------------------------
    def _publish(self, eng, idle: bool) -> None:
        self._load = (len(eng.scheduler.running), len(eng.scheduler.waiting))
        self._publish_tenants(eng, force=idle)      # idle next: publish the final rows
        self._waiting_ids = tuple(eng.scheduler.waiting_request_ids()) if eng.scheduler.waiting else ()

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

    def run_on_engine(self, fn, timeout: float | None = None):
        """Run `fn(engine)` on the engine thread between two steps; its result (or exception)."""
        return self.engine_thread.run(fn, timeout=timeout)

    def new_request_id(self, prefix: str = "req") -> str:
        """A request id no other request of this LLM has (prefix-N)."""
        return f"{prefix}-{next(self._ids)}"

    # ---- streaming front ------------------------------------------------------------------------
    def encode_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError("prompt must be a string, a list of token ids, or {'prompt_token_ids': [...]}")
        self.engine.validate_prompt(ids)
        return ids

    def submit(self, prompt, params: SamplingParams | None = None, *, session_id: str | None = None,
               request_id: str | None = None, cache_salt: str | None = None, tenant: str | None = None,
               priority: int = 0) -> RequestStream:
        """Queue one request; returns its stream at once. Bad input raises ValueError here; over an
        admission bound, engine.core.admission.QueueFull. `tenant` (default "local") and `priority`
        (lower first) feed the fair scheduler (engine/core/fairness.py)."""
        req, stream = self._prepare(prompt, params, session_id, request_id, cache_salt, tenant, priority)
        # not waiting for the engine thread: submits from many threads land in the next step
        self._enqueue_add([req])
        return stream

    def _enqueue_add(self, reqs: list[Request]) -> None:
        if self.engine_thread.add(reqs):
            return
        for req in reqs:
            self.engine.fail_request_outputs(req, SHUT_DOWN)

    def _prepare(self, prompt, params, session_id=None, request_id=None, cache_salt=None, tenant=None,
                 priority: int = 0):
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        rid = request_id or self.new_request_id()
        tenant = str(tenant) if tenant else LOCAL_TENANT
        with self._live_lock:
            if self.engine_thread.closed:
                raise RuntimeError(SHUT_DOWN)
            if rid in self._live:
                raise ValueError(f"request id {rid!r} is already in use")
            self.admission.enter(rid, tenant, len(ids))     # QueueFull: nothing was queued
            self._live.add(rid)
        stream = RequestStream(rid, ids, params.n, self)
        open_outputs = [params.n]

        admission = self.admission

        def on_output(delta: RequestOutputDelta) -> None:   # runs in the engine thread
            admission.leave(rid)                # admitted (first delta) or ended: no longer queued
            if delta.finished:
                open_outputs[0] -= 1
                if open_outputs[0] == 0:
                    with self._live_lock:
                        self._live.discard(rid)
            stream._put(delta)

        req = Request(rid, ids, params, session_id=session_id, cache_salt=cache_salt, on_output=on_output,
                      tenant=tenant, priority=int(priority))
        try:
            self._check_shaping(params)
            if params.structured is not None:   # compiled here, in the caller's thread, not the step loop
                req.grammar = self.engine.grammars.matcher(params.structured)
        except ValueError:
            with self._live_lock:
                self._live.discard(rid)
            raise
        return req, stream

    def compile_structured(self, spec) -> None:
        """Compile a StructuredSpec into the engine's grammar cache now, in the caller's thread (a
        server calls this from a worker thread before submit). ValueError if it is not valid."""
        self.engine.grammars.matcher(spec)

    def _check_shaping(self, params: SamplingParams) -> None:
        """Token ids in logit_bias must exist in this model's vocabulary (a 400, not a step error)."""
        vocab = self.engine.vocab_size
        bad = [t for t in (params.logit_bias or {}) if t >= vocab]
        if bad:
            raise ValueError(f"logit_bias: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")

    def submit_chat(self, messages: list[dict], params: SamplingParams | None = None, *,
                    session_id: str | None = None, request_id: str | None = None,
                    previous_ids: list[int] | None = None, cache_salt: str | None = None,
                    tenant: str | None = None, priority: int = 0) -> RequestStream:
        """Chat turn. The previous turn's exact token ids are reused as the prefix: `previous_ids`
        when the caller kept them (e.g. read back from storage after a restart, or the branch being
        continued), else the session's last turn. They are used only if they decode to the start
        of the rendered conversation, so a wrong guess costs cache hits, never correctness.
        `cache_salt` (e.g. the user name under --auth): prefix-cache hits only between requests
        with the same salt, except for the leading system messages, shared by everyone."""
        previous = previous_ids if previous_ids else (self.engine.sessions.token_ids(session_id)
                                                      if session_id else None)
        ids = continue_session_prompt(self.tokenizer, messages, previous)
        salt = prompt_salt(self.tokenizer, messages, ids, cache_salt)   # engine/kv/salt_rule.py
        return self.submit({"prompt_token_ids": ids}, params, session_id=session_id, request_id=request_id,
                           cache_salt=salt, tenant=tenant, priority=priority)

    def submit_continue(self, token_ids: list[int], params: SamplingParams | None, messages: list[dict], *,
                        session_id: str | None = None, request_id: str | None = None,
                        cache_salt: str | None = None, tenant: str | None = None,
                        priority: int = 0) -> RequestStream:
        """Continue a reply: `token_ids` are its prompt's exact ids + the reply's own ids, so the
        session's parked blocks are reused and greedy decoding goes on exactly as if the reply had
        never stopped. `messages` (the conversation before the reply) only places the shared
        system-prompt boundary of the cache salt, as submit_chat does."""
        salt = prompt_salt(self.tokenizer, messages, list(token_ids), cache_salt)   # engine/kv/salt_rule.py
        return self.submit({"prompt_token_ids": list(token_ids)}, params, session_id=session_id,
                           request_id=request_id, cache_salt=salt, tenant=tenant, priority=priority)

    def abort(self, request_id: str) -> bool:
        return self.engine_thread.abort(request_id)

    # ---- sessions (the table itself is engine/core/sessions.py, owned by the engine) ---------------
    def open_session(self, session_id: str, token_ids: list[int] | None = None) -> None:
        """Declare a chat session, optionally with the exact ids of its last turn (prompt + reply)
        read back from storage after a restart; its next turn continues from them."""
        if token_ids is not None:
            self.engine.validate_prompt(list(token_ids) or [0])
        self.engine.sessions.open(session_id, token_ids)

    def session_token_ids(self, session_id: str) -> list[int] | None:
        """The exact ids the session's next turn continues from (None: no turn yet)."""
        return self.engine.sessions.token_ids(session_id)

    def fork_session(self, src: str, dst: str) -> None:
        """A new session that starts from `src`'s ids; the shared prefix shares its blocks."""
        self.engine.sessions.fork(src, dst)

    def end_session(self, session_id: str) -> bool:
        """Release a session's parked KV blocks (no tab shows it any more); its ids are kept."""
        return bool(self.run_on_engine(lambda eng: eng.release_session(session_id)))

    release_session = end_session

    def close_session(self, session_id: str) -> bool:
        """Forget a session (its conversation was deleted): ids dropped, blocks released."""
        return bool(self.run_on_engine(lambda eng: eng.close_session(session_id)))

    # ---- batch API -------------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        encoded = [self.encode_prompt(p) for p in prompts]        # validate all before submitting any
        prepared = []
        try:
            for ids, p in zip(encoded, params):
                prepared.append(self._prepare({"prompt_token_ids": ids}, p))
        except BaseException:           # e.g. QueueFull halfway: the rest were never queued
            for req, _ in prepared:
                self.admission.leave(req.request_id)
                with self._live_lock:
                    self._live.discard(req.request_id)
            raise
        self._enqueue_add([req for req, _ in prepared])     # one command: one step admits them all
        streams = [stream for _, stream in prepared]
        try:
            return [collect(s, p or SamplingParams()) for s, p in zip(streams, params)]
        except BaseException:
            for s in streams:               # do not leave the rest of the batch running
                try:
                    s.abort()
                except RuntimeError:
                    pass
            raise

    def chat(self, messages, sampling_params=None, use_tqdm: bool = False) -> list[RequestOutput]:
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt_token_ids": continue_session_prompt(self.tokenizer, c, None)} for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm)

    # ---- beam search (engine/core/beam_search.py) ------------------------------------------------------
    def beam_search(self, prompts, params, use_tqdm: bool = False) -> list:
        """vLLM-shaped: the params.beam_width best sequences per prompt (BeamSearchOutput each)."""
        from engine.front.beam_api import submit_beam_searches
        handles = submit_beam_searches(self, _as_prompt_list(prompts), params)
        try:
            return [h.result() for h in handles]
        except BaseException:
            for h in handles:
                try:
                    h.abort()
                except RuntimeError:
                    pass
            raise

    def submit_beam_search(self, prompt, params, *, on_step=None, request_id: str | None = None,
                           cache_salt=None, tenant: str | None = None, priority: int = 0):
        """One search, not waited for: a BeamSearchHandle (result() / await / abort()); on_step gets a
        BeamStepEvent per step in the engine thread (forks, frees, current beams) for live views.
        cache_salt, tenant, priority: as for submit (engine/kv/salt_rule.prompt_salt gives a chat's
        salt); the search counts against the tenant's queue bounds (QueueFull) until it starts."""
        from engine.front.beam_api import submit_beam_searches
        return submit_beam_searches(self, [prompt], params, on_step,
                                    [request_id] if request_id else None, cache_salt=cache_salt,
                                    tenant=tenant, priority=priority)[0]

    # ---- public face: what the UI, the bench and the tests may read --------------------------------
    def get_tokenizer(self):
        return self.tokenizer

    @property
    def max_model_len(self) -> int:
        """Longest prompt + reply, in tokens."""
        return self._info.max_model_len

    def model_info(self) -> ModelInfo:
        return self._info

    def count_prompt_tokens(self, messages: list[dict]) -> int:
        """Length of the prompt these chat messages render to (no session reuse), for a
        "too long" answer before anything is stored or submitted."""
        return len(continue_session_prompt(self.tokenizer, messages, None))

    # ---- pinned prefixes (engine/kv/pinning.py, engine/front/pin_api.py) ---------------------------------
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
        self.run_on_engine(lambda eng: eng.kv.pins.check_cap(name, num_tokens))

    def unpin(self, name: str) -> bool:
        return pin_api.unpin(self, name)

    def pins(self) -> list:
        return pin_api.pins(self)

    def reset_peak_stats(self) -> None:
        """Start a fresh window for peak_used_blocks and peak_running (bench runs)."""
        self.run_on_engine(lambda eng: eng.reset_peak_stats())

    # ---- observability ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """The stats contract as JSON (engine/observe/kv_contract.KVStats.to_json())."""
        return self.run_on_engine(lambda eng: eng.stats())

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

    def kv_stats(self):
        """The stats contract, typed (engine/observe/kv_contract.KVStats)."""
        return self.run_on_engine(lambda eng: eng.kv_stats())

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

    def shutdown(self) -> None:
        self.engine_thread.stop(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _as_prompt_list(prompts) -> list:
    """One prompt (text, {"prompt_token_ids": ...} or a list of ids) or many, as a list."""
    single = isinstance(prompts, (str, dict)) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
    return [prompts] if single else list(prompts)
