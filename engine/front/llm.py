"""`LLM`: the vLLM-shaped batch API (generate, chat, beam_search) over a thread-safe streaming core.

One background thread owns the engine (model + pool) and runs steps while there is work
(`EngineThread`, engine/front/engine_thread.py). Callers in any thread submit requests and read
deltas from a `RequestStream` (sync iteration, or `async for` in an asyncio handler); everything
else that must touch the engine runs on that thread through `run_on_engine`. What a chat server
needs on top (sessions, pins, snapshots, tenants, load) is the serving face,
`engine/front/serving.ServingLLM`: this class stays what an offline batch user needs.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

from engine.core.admission import AdmissionControl, QueueBounds
from engine.core.tenancy import LOCAL_TENANT
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.exec.loader import load_model
from engine.exec.model_info import ModelInfo, build_model_info
from engine.outputs import RequestOutput
from engine.sampling.sampling_params import SamplingParams
from engine.front.engine_thread import SHUT_DOWN, EngineThread
from engine.front.request_stream import RequestStream, collect
from engine.core.sequence import Request, RequestOutputDelta
from engine.text.reasoning import split_outputs
from engine.text.session_prompt import continue_session_prompt


class LLM:
    kind = "local"  # engine.protocol.ChatEngine: the engine runs in this process

    def __init__(
        self,
        config: EngineConfig | str | None = None,
        /,
        *,
        progress=None,
        hf_overrides: dict | None = None,
        queue_bounds: QueueBounds | None = None,
        **options,
    ):
        """`config`: an EngineConfig (app.py builds one from its flags), or a model path as vLLM's
        `LLM(model)`; keyword options are EngineConfig fields (`LLM(model=..., num_blocks=64)`),
        applied over `config`. progress(fraction, message): load progress. hf_overrides: config
        overrides of a load_format="dummy" model. queue_bounds: the four queue-bound fields as one
        engine.core.admission.QueueBounds (kept for callers that build one)."""
        if isinstance(config, str):
            options.setdefault("model", config)
            config = None
        if queue_bounds is not None:
            options.update(dataclasses.asdict(queue_bounds))
        cfg = (
            dataclasses.replace(config, **options)
            if config is not None
            else EngineConfig(**options)
        )
        if hf_overrides and cfg.load_format != "dummy":
            raise ValueError("hf_overrides is only used with load_format='dummy'")
        dummy_kw = (
            dict(seed=cfg.seed, device=cfg.device, dtype=cfg.torch_dtype, hf_overrides=hf_overrides)
            if cfg.load_format == "dummy"
            else {}
        )
        loaded = load_model(cfg.model, progress=progress, load_format=cfg.load_format, **dummy_kw)
        self.config = cfg
        self.model_source = loaded.source
        self.hf_folder = loaded.hf_folder
        self.engine = LLMEngine(cfg, loaded)
        self.admission = AdmissionControl(
            QueueBounds(*cfg.queue_bounds)
        )  # engine/core/admission.py
        self.tokenizer = loaded.tokenizer
        self._info = build_model_info(
            loaded.source,
            loaded.config,
            cfg,
            self.engine.runner,
            self.engine.eos_ids,
            tokenizer=loaded.tokenizer,
        )
        self._ids = itertools.count()
        self._live: set[str] = set()  # request ids not yet finished
        self._live_lock = threading.Lock()
        # the one owner of the engine from here on (engine/front/engine_thread.py)
        self.engine_thread = EngineThread(self.engine, after_step=self._after_step)

    def _after_step(self, eng, idle: bool) -> None:
        """Engine thread, after each step: nothing here (the serving face publishes its figures)."""

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
            raise ValueError(
                "prompt must be a string, a list of token ids, or {'prompt_token_ids': [...]}"
            )
        self.engine.validate_prompt(ids)
        return ids

    def submit(
        self,
        prompt,
        params: SamplingParams | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ) -> RequestStream:
        """Queue one request; returns its stream at once. Bad input raises ValueError here; over an
        admission bound, engine.core.admission.QueueFull. `tenant` (default "local") and `priority`
        (lower first) feed the fair scheduler (engine/core/fairness.py)."""
        req, stream = self._prepare(
            prompt, params, session_id, request_id, cache_salt, tenant, priority
        )
        # not waiting for the engine thread: submits from many threads land in the next step
        self._enqueue_add([req])
        return stream

    def _enqueue_add(self, reqs: list[Request]) -> None:
        if self.engine_thread.add(reqs):
            return
        for req in reqs:
            self.engine.fail_request_outputs(req, SHUT_DOWN)

    def _prepare(
        self,
        prompt,
        params,
        session_id=None,
        request_id=None,
        cache_salt=None,
        tenant=None,
        priority: int = 0,
    ):
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        rid = request_id or self.new_request_id()
        tenant = str(tenant) if tenant else LOCAL_TENANT
        with self._live_lock:
            if self.engine_thread.closed:
                raise RuntimeError(SHUT_DOWN)
            if rid in self._live:
                raise ValueError(f"request id {rid!r} is already in use")
            self.admission.enter(rid, tenant, len(ids))  # QueueFull: nothing was queued
            self._live.add(rid)
        stream = RequestStream(rid, ids, params.n, self)
        open_outputs = [params.n]

        admission = self.admission

        def on_output(delta: RequestOutputDelta) -> None:  # runs in the engine thread
            admission.leave(rid)  # admitted (first delta) or ended: no longer queued
            if delta.finished:
                open_outputs[0] -= 1
                if open_outputs[0] == 0:
                    with self._live_lock:
                        self._live.discard(rid)
            stream._put(delta)

        req = Request(
            rid,
            ids,
            params,
            session_id=session_id,
            cache_salt=cache_salt,
            on_output=on_output,
            tenant=tenant,
            priority=int(priority),
            validated=True,
        )  # by encode_prompt
        try:
            self._check_shaping(params)
            if (
                params.structured is not None
            ):  # compiled here, in the caller's thread, not the step loop
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
            raise ValueError(
                f"logit_bias: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})"
            )

    def abort(self, request_id: str) -> bool:
        return self.engine_thread.abort(request_id)

    # ---- batch API -------------------------------------------------------------------------------
    def generate(
        self, prompts, sampling_params=None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        prompts = _as_prompt_list(prompts)
        params = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        encoded = [self.encode_prompt(p) for p in prompts]  # validate all before submitting any
        prepared = []
        try:
            for ids, p in zip(encoded, params):
                prepared.append(self._prepare({"prompt_token_ids": ids}, p))
        except BaseException:  # e.g. QueueFull halfway: the rest were never queued
            for req, _ in prepared:
                self.admission.leave(req.request_id)
                with self._live_lock:
                    self._live.discard(req.request_id)
            raise
        self._enqueue_add([req for req, _ in prepared])  # one command: one step admits them all
        streams = [stream for _, stream in prepared]
        try:
            return [
                split_outputs(
                    collect(s, p or SamplingParams()), self.tokenizer, self._info.reasoning_markers
                )
                for s, p in zip(streams, params)
            ]
        except BaseException:
            for s in streams:  # do not leave the rest of the batch running
                try:
                    s.abort()
                except RuntimeError:
                    pass
            raise

    def chat(
        self,
        messages,
        sampling_params=None,
        use_tqdm: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """vLLM-shaped. chat_template_kwargs: {"enable_thinking": bool, "reasoning_effort": "low" |
        "medium" | "high"} (other keys are ignored). A thinking model's outputs carry their
        reasoning split off (CompletionOutput.reasoning)."""
        kw = chat_template_kwargs or {}
        mode = dict(
            enable_thinking=kw.get("enable_thinking"), reasoning_effort=kw.get("reasoning_effort")
        )
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [
            {"prompt_token_ids": continue_session_prompt(self.tokenizer, c, None, **mode)}
            for c in convs
        ]
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

    # ---- the model ---------------------------------------------------------------------------------
    def get_tokenizer(self):
        return self.tokenizer

    @property
    def max_model_len(self) -> int:
        """Longest prompt + reply, in tokens."""
        return self._info.max_model_len

    def model_info(self) -> ModelInfo:
        return self._info

    def reset_peak_stats(self) -> None:
        """Start a fresh window for peak_used_blocks and peak_running (bench runs)."""
        self.run_on_engine(lambda eng: eng.reset_peak_stats())

    # ---- observability ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """The stats contract as JSON (engine/observe/kv_contract.KVStats.to_json())."""
        return self.run_on_engine(lambda eng: eng.stats())

    def kv_stats(self):
        """The stats contract, typed (engine/observe/kv_contract.KVStats)."""
        return self.run_on_engine(lambda eng: eng.kv_stats())

    def shutdown(self) -> dict | None:
        """Stop the engine; with a KV tier, the pool's computed blocks are kept in it first (for at
        most a few seconds): returns {"saved", "already", "left", "seconds"}, else None."""
        return self.engine_thread.stop(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _as_prompt_list(prompts) -> list:
    """One prompt (text, {"prompt_token_ids": ...} or a list of ids) or many, as a list."""
    single = isinstance(prompts, (str, dict)) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    )
    return [prompts] if single else list(prompts)
