"""The synchronous engine core: add requests, step, abort. Only the engine thread calls it.

One step = schedule -> copy-on-write copies -> one forward over the packed batch -> sample ->
detokenize -> stream deltas -> free or park finished sequences.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from engine.core.request_driver import RequestDriver
from engine.config import EngineConfig
from engine.text.detokenizer import IncrementalDetokenizer
from engine.core.fairness import make_policy
from engine.kv.kv_cache_manager import KVCacheManager
from engine.exec.model_info import kv_dtype_name
from engine.observe.kv_contract import KVSnapshot, KVStats
from engine.observe.kv_snapshot import kv_stats, take_snapshot
from engine.exec.loader import LoadedModel
from engine.exec.model_runner import ModelRunner
from engine.outputs import STATE_FINISHED, STATE_PREEMPTED, STATE_RESUMED, STATE_RUNNING
from engine.sampling import prompt_logprobs
from engine.sampling.structured.compiler import GrammarCompiler
from engine.sampling.structured.state import GrammarState
from engine.sampling.sampler import argmax_suffices, make_generator
from engine.core.sample_isolated import sample_isolated
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, RequestOutputDelta, Sequence, SeqStatus
from engine.core.sessions import SessionTable
from engine.core.speculation import Speculator
from engine.text.end_of_turn import end_of_turn_ids
from engine.text.harmony import structure_ids

log = logging.getLogger("paged_chat.engine")


class LLMEngine:
    def __init__(self, cfg: EngineConfig, loaded: LoadedModel):
        self.cfg = cfg
        self.tokenizer = loaded.tokenizer
        self.hf_config = loaded.config
        torch.manual_seed(cfg.seed)
        self._seed_rng = make_generator(cfg.seed)
        self.runner = ModelRunner(cfg, loaded.config, loaded.weights, loaded.weights_key)
        self.max_model_len = self.runner.max_model_len
        states = None  # linear-attention layers: state slots beside the blocks (engine/kv/state_groups.py)
        if self.runner.linear_state is not None:
            if cfg.speculative:
                raise ValueError(
                    "speculative decoding is not supported for models with linear-attention layers: "
                    "their state cannot be rolled back past rejected draft tokens"
                )
            from engine.kv.state_groups import StateGroups

            states = StateGroups(
                self.runner.num_state_slots,
                cfg.block_size,
                bytes_per_slot=self.runner.state_bytes_per_slot,
            )
        self.kv = KVCacheManager(
            self.runner.num_blocks,
            cfg.block_size,
            max_model_len=self.max_model_len,
            layout=self.runner.kv_layout,
            kv_bytes_per_token=self.runner.kv_bytes_per_token,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_pin_fraction=cfg.max_pin_fraction,
            states=states,
        )
        # the KV wing's owners the loop talks to: parked sessions, pins, the pool's peak window
        self.parked, self.pins, self.block_pool = self.kv.parked, self.kv.pins, self.kv.pool
        from engine.kv.tier.setup import build_tier  # second KV tier (off unless asked for)

        self.tier_link = build_tier(
            self.kv,
            self.runner.kv_pool,
            loaded.weights,
            kv_rotation=self.runner.kv_rotation,
            gib=cfg.kv_offload_gib,
            folder=cfg.kv_offload_dir,
            device=cfg.device,
            dtype=cfg.dtype,
            state_io=self.runner.linear_state,
        )
        self.scheduler = Scheduler(
            self.kv,
            cfg.max_num_seqs,
            cfg.max_num_batched_tokens,
            make_policy(
                cfg.scheduling_policy, cfg.tenant_weights, starvation_wait_s=cfg.starvation_wait_s
            ),
        )
        self.requests: dict[str, Request] = {}
        self.sessions = (
            SessionTable()
        )  # chat sessions: exact ids + life cycle (engine/core/sessions.py)
        self.eos_ids = set(
            end_of_turn_ids(self.hf_config, self.tokenizer)
        )  # engine/text/end_of_turn.py
        self.kept_markers = structure_ids(self.tokenizer)  # harmony's channels stay in the text
        self.generated_tokens_total = 0
        self.prompt_tokens_computed_total = 0
        self.steps = 0
        self._broken: set[str] = set()  # requests whose consumer raised: aborted after the step
        self.drivers: dict[
            str, RequestDriver
        ] = {}  # driven requests (engine/core/request_driver.py)
        self._paused: set[str] = set()  # seq ids preempted and not yet scheduled again
        self.vocab_size = self.runner.model.embed.shape[0]
        self.grammars = GrammarCompiler(
            self.tokenizer, self.vocab_size
        )  # engine/sampling/structured/
        self.spec = (
            Speculator(cfg.speculative, cfg.num_speculative_tokens, cfg.speculative_adaptive)
            if cfg.speculative
            else None
        )

    # ---- requests -------------------------------------------------------------------------
    def validate_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; this engine's max_model_len is "
                f"{self.max_model_len} (prompt + at least 1 generated token must fit)"
            )
        vocab = self.runner.model.embed.shape[0]
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")

    def add_request(self, req: Request) -> None:
        if not req.validated:  # the front validated it once already (LLM.submit)
            self.validate_prompt(req.prompt_ids)
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        p = req.params
        if p.structured is not None and req.grammar is None:  # LLM.submit compiles off the loop
            req.grammar = self.grammars.matcher(p.structured)
        if (
            p.prompt_logprobs is not None
        ):  # every prompt position computed (engine/sampling/prompt_logprobs.py)
            req.cache_salt = prompt_logprobs.salt_for(req.request_id)
        self.requests[req.request_id] = req
        if req.session_id is not None:
            self.sessions.begin_turn(req.session_id, req.request_id)
        self._new_sequence(req, 0, list(req.prompt_ids))

    def _new_sequence(self, req: Request, index: int, token_ids: list[int]) -> Sequence:
        p = req.params
        seed = (
            (p.seed * 1_000_003 + index)
            if p.seed is not None
            else int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        )
        detok = IncrementalDetokenizer(
            self.tokenizer, req.prompt_ids, p.stop, p.skip_special_tokens, self.kept_markers
        )
        seq = Sequence(
            f"{req.request_id}#{index}", req, index, token_ids, detok, make_generator(seed)
        )
        req.seqs.append(seq)
        if index == 0:
            if p.structured is not None:
                seq.grammar = GrammarState.start(p.structured, self.grammars, req.grammar)
            self.scheduler.add(seq)
        return seq

    def abort_request(
        self, request_id: str, reason: str = "abort", error: str | None = None
    ) -> bool:
        """End a request now (user stop, closed tab, engine error); its blocks are released."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        for seq in list(req.seqs):
            if seq.status is not SeqStatus.FINISHED:
                self._finish(seq, reason, error=error)
        if not req.forked and req.on_output is not None:  # n > 1 children never got created
            for i in range(len(req.seqs), req.params.n):
                self._deliver(
                    req, RequestOutputDelta(req.request_id, i, "", [], True, reason, error, {})
                )
        driver = self.drivers.pop(
            request_id, None
        )  # a driven request: its caller learns of the abort
        if driver is not None:
            driver.abort(reason, error)
        self.requests.pop(request_id, None)
        return True

    # ---- driven requests (engine/core/request_driver.py) ----------------------------------------
    def add_driven_request(self, req: Request, driver: RequestDriver) -> None:
        """Admit a request whose tokens `driver` picks (engine thread). Bad input raises here,
        before anything is registered."""
        if not req.validated:
            self.validate_prompt(req.prompt_ids)
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.requests[req.request_id] = req
        self.drivers[req.request_id] = driver
        driver.start(self)

    def end_driven_request(self, request_id: str) -> None:
        """The driver is done with its request (its sequences are already freed)."""
        self.drivers.pop(request_id, None)
        self.requests.pop(request_id, None)

    def _argmax_only(self, plan) -> bool:
        """Every logits row of the step is a plain greedy argmax (engine/step_plan.py): no
        prompt-logprob rows, no driven request (beam search reads every logit), no grammar."""
        if plan.prompt_logprob_rows or not plan.logits:
            return False
        for lr in plan.logits:
            seq = plan.rows[lr.row].seq
            req = seq.request
            if (
                req.request_id in self.drivers
                or seq.grammar is not None
                or not argmax_suffices(req.params)
            ):
                return False
        return True

    def _route_driven_rows(self, seqs: list[Sequence], logits: torch.Tensor):
        """Give each driver the rows of its sequences; return the rest for sampling."""
        keep: list[int] = []
        mine: dict[str, list[int]] = {}
        for r, s in enumerate(seqs):
            rid = s.request.request_id
            (mine.setdefault(rid, []) if rid in self.drivers else keep).append(r)
        for rid, rows in mine.items():
            self.drivers[rid].on_logits(self, [seqs[r] for r in rows], logits[rows])
        return ([seqs[r] for r in keep], logits[keep]) if mine else (seqs, logits)

    def release_session(self, session_id: str) -> bool:
        """Release a session's parked blocks, keeping its ids; a turn still running for it will
        free, not park. False if no blocks were parked."""
        handle = self.sessions.release(session_id)
        return handle is not None and self.parked.release(handle)

    def close_session(self, session_id: str) -> bool:
        """Forget a session (conversation deleted): ids dropped, blocks released."""
        self.sessions.close(session_id)
        had = session_id in self.parked
        self.kv.forget_owner(session_id)  # its private blocks leave the pool and the KV tier
        return had

    def keep_pool_in_tier(self, budget_s: float) -> dict | None:
        """A graceful stop: keep the pool's computed blocks in the KV tier, for at most budget_s
        (engine/kv/tier/link.save_pool); None without a tier."""
        if self.tier_link is None:
            return None
        return self.tier_link.save_pool(self.block_pool, budget_s, holders=self.kv.holders())

    def fail_request_outputs(self, req: Request, message: str) -> None:
        """Close every output of a request that never got into the engine."""
        if req.on_output is not None:
            for i in range(req.params.n):
                self._deliver(
                    req, RequestOutputDelta(req.request_id, i, "", [], True, "error", message, {})
                )

    def fail_all(self, message: str) -> None:
        """After a failed step: the failed batch's blocks were hashed when scheduled but their KV may
        never have been written, so their cache entries are dropped before everything is freed."""
        for req in list(self.requests.values()):
            for seq in req.seqs:
                if self.kv.has_sequence(seq.seq_id):
                    self.kv.forget_cached(seq.seq_id)
            if req.session_id is not None:  # free, do not park, what may hold unwritten KV
                self.sessions.release(req.session_id)
            self.abort_request(req.request_id, reason="error", error=message)

    def _deliver(self, req: Request, delta: RequestOutputDelta) -> None:
        """Hand a delta to the request's consumer; a consumer that raises is cut off, not the engine."""
        try:
            req.on_output(delta)
        except Exception:
            req.on_output = None
            self._broken.add(req.request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ---- one iteration ----------------------------------------------------------------------
    def step(self) -> None:
        while self._broken:
            self.abort_request(self._broken.pop())
        if self.tier_link is not None:
            self.tier_link.new_step()  # the KV tier's per-step load budget
        if self.spec is not None:  # drafts first: the scheduler sizes their steps
            try:
                self.spec.propose(self.scheduler.running, self)
            except Exception:  # an optimisation must not fail the batch: plain steps
                log.exception("speculative drafting failed; this step runs without drafts")
                for seq in self.scheduler.running:
                    seq.draft = []
        plan = self.scheduler.schedule()  # engine/step_plan.py: what this step computes
        self._signal_preemptions(plan)
        for row in plan.rows:
            seq = row.seq
            if (
                row.start == seq.cached_tokens
                and seq.first_token_time is None
                and row.end <= seq.prompt_len
            ):
                self._emit(seq, "", [], state=STATE_RUNNING)
        if not plan:
            return
        plan.argmax_only = self._argmax_only(plan)
        # logits stay on the model's device: the sampler runs there; only token ids (and requested
        # logprobs) come back to the host. Prefill chunks need KV even when unsampled.
        t0 = time.perf_counter()
        if self.spec is not None:
            self.spec.step_started(plan)
        logits = self.runner.run_on_device(plan)
        if (
            self.tier_link is not None and self.runner.device.type == "cpu"
        ):  # synchronous: a real cost
            self.tier_link.observe_compute(plan.num_tokens, time.perf_counter() - t0)
        sample_rows = plan.sampled
        if len(sample_rows) < len(plan.logits):  # prompt-logprob rows follow the sampled ones
            prompt_logprobs.record(plan, logits[len(sample_rows) :])
            logits = logits[: len(sample_rows)]
        self.steps += 1
        self.prompt_tokens_computed_total += sum(
            max(0, min(row.end, row.seq.prompt_len) - row.start) for row in plan.rows
        )
        if not sample_rows:
            return
        seqs = [plan.rows[lr.row].seq for lr in sample_rows]
        if self.drivers:  # driven requests' rows go to their driver, not the sampler
            seqs, logits = self._route_driven_rows(seqs, logits)
        seqs, logits = self._fork_after_prefill(seqs, logits)
        if self.spec is None:
            sampled = sample_isolated(seqs, logits, self.vocab_size)
            now = time.time()
            for seq, res in zip(seqs, sampled):
                if isinstance(res, Exception):
                    self._fail_sampling(seq, res)
                elif seq.status is not SeqStatus.FINISHED:  # a failed sibling may have ended it
                    self._append(seq, res[0], now, res[1])
        else:
            self._sample_speculative(seqs, logits)
            self.spec.step_finished()
        while self._broken:
            self.abort_request(self._broken.pop())

    def _sample_speculative(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """As the plain path, with a drafting sequence's k + 1 consecutive rows verified together
        (engine/core/speculation.py): one sampler call for the whole batch."""
        groups, hist, states = [], [], {}
        i = 0
        while i < len(seqs):
            seq = seqs[i]
            k = len(seq.draft)
            groups.append((seq, i, k))
            if k:
                hist += self.spec.histories(seq, k)
                if not seq.request.params.greedy:
                    states[seq.seq_id] = seq.generator.get_state()
            else:
                hist.append(seq.token_ids)
            i += k + 1
        sampled = sample_isolated(seqs, logits, self.vocab_size, hist)
        now = time.time()
        for seq, i, k in groups:
            res = sampled[i : i + k + 1]
            err = next((r for r in res if isinstance(r, Exception)), None)
            if err is not None:
                self._fail_sampling(seq, err)
                continue
            if seq.status is SeqStatus.FINISHED:  # a failed sibling may have ended it
                continue
            if k:
                try:
                    res = self.spec.accept(seq, res, states.get(seq.seq_id), self.kv)
                except Exception as e:  # noqa: BLE001 - this request's alone; its blocks are freed
                    self._fail_sampling(seq, e)
                    continue
            if seq.spec is not None:
                seq.spec.steps += 1
            for tok, lp in res:
                self._append(seq, tok, now, lp)
                if seq.status is SeqStatus.FINISHED:
                    break

    def _signal_preemptions(self, plan) -> None:
        """Tell a preempted request's own stream that it is paused (state "preempted"), and once it
        is scheduled again that it resumed (state "resumed"): the chat shows "paused: memory full"
        from the engine's word, not from guessing at a gap between tokens. A sequence preempted in
        this schedule is never in this batch (victims are taken from the end of the running list)."""
        for seq in self.scheduler.take_preempted():
            self._paused.add(seq.seq_id)
            self._emit(seq, "", [], state=STATE_PREEMPTED)
        if self._paused:
            for row in plan.rows:
                seq = row.seq
                if seq.seq_id in self._paused:
                    self._paused.discard(seq.seq_id)
                    self._emit(seq, "", [], state=STATE_RESUMED)

    def _fail_sampling(self, seq: Sequence, err: Exception) -> None:
        """End the request whose sampling raised; its blocks are freed, not parked for reuse."""
        req = seq.request
        if req.request_id not in self.requests:
            return  # already ended by a sibling's failure
        if req.session_id is not None:  # the session table decides: free, do not park, a
            self.sessions.release(req.session_id)  # failed step's blocks for the next turn
        self.abort_request(req.request_id, reason="error", error=f"sampling failed: {err!r}")

    def _fork_after_prefill(self, seqs: list[Sequence], logits: torch.Tensor):
        """n > 1: the prompt was prefilled once; children share its blocks (copy-on-write)."""
        out_seqs, out_rows = [], []
        for r, seq in enumerate(seqs):
            out_seqs.append(seq)
            out_rows.append(r)
            req = seq.request
            if req.params.n > 1 and not req.forked:
                req.forked = True
                for i in range(1, req.params.n):
                    child = self._new_sequence(req, i, list(seq.token_ids))
                    child.cached_tokens = seq.cached_tokens
                    if seq.grammar is not None:  # each fork its own matcher state
                        child.grammar = seq.grammar.fork()
                    self.kv.fork(seq.seq_id, child.seq_id, child.token_ids)
                    self.scheduler.add_forked(seq, child)
                    out_seqs.append(child)
                    out_rows.append(r)
        if len(out_rows) == len(seqs):  # nothing forked: no gather (a copy, and on CUDA an upload)
            return out_seqs, logits
        return out_seqs, logits[out_rows]

    def _append(self, seq: Sequence, tok: int, now: float, logprob=None) -> None:
        seq.token_ids.append(tok)
        self.generated_tokens_total += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.last_token_time = now
        p = seq.request.params
        text = seq.detok.add(tok)
        reason = None
        g = seq.grammar
        if g is not None:
            g.accept(tok, text)
        if (
            g is not None
            and g.error is not None
            and g.matcher is not None
            and not seq.detok.stopped
        ):
            self._finish(seq, "error", text, [tok], error=f"structured: {g.error}")
            return
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            reason = "stop"
        elif seq.detok.stopped:
            reason = "stop"
        elif g is not None and g.done:  # the grammar is complete: nothing may follow
            reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        lps = None if logprob is None else [logprob]
        if reason is None:
            self._emit(seq, text, [tok], logprobs=lps)
        else:
            self._finish(seq, reason, text, [tok], logprobs=lps)

    def _finish(
        self,
        seq: Sequence,
        reason: str,
        text: str = "",
        toks: list[int] | None = None,
        error: str | None = None,
        logprobs=None,
    ) -> None:
        self.scheduler.remove(seq)
        self._paused.discard(seq.seq_id)
        was_admitted = self.kv.has_sequence(seq.seq_id)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        req = seq.request
        owner = None
        if (
            req.session_id is not None and seq.index == 0
        ):  # the session table decides, and keeps the ids
            owner = self.sessions.finish_turn(
                req.session_id, req.request_id, None if reason == "error" else seq.token_ids
            )
        if self.spec is not None:
            self.spec.finished(seq)
        if was_admitted:
            if owner is not None:
                self.kv.park(seq.seq_id, owner)
            else:
                self.kv.free(seq.seq_id)
        self._emit(
            seq,
            text + seq.detok.flush(),
            toks or [],
            finished=True,
            reason=reason,
            error=error,
            logprobs=logprobs,
        )
        if all(s.status is SeqStatus.FINISHED for s in req.seqs) and (
            req.forked or req.params.n == 1
        ):
            self.requests.pop(req.request_id, None)

    def _emit(
        self,
        seq: Sequence,
        text: str,
        toks: list[int],
        finished=False,
        reason=None,
        state=None,
        error=None,
        logprobs=None,
    ):
        req = seq.request
        if req.on_output is None:
            return
        now = time.time()
        out_n = len(seq.output_ids)
        m = {
            "prompt_tokens": seq.prompt_len,
            "cached_tokens": seq.cached_tokens,
            "output_tokens": out_n,
            "cached_blocks": seq.cached_tokens
            // self.cfg.block_size,  # shared prompt blocks reused
            "state": state or (STATE_FINISHED if finished else STATE_RUNNING),
        }
        if seq.first_token_time is not None:
            m["ttft_s"] = seq.first_token_time - req.arrival_time
            span = (seq.last_token_time or now) - seq.first_token_time
            m["tokens_per_s"] = (out_n - 1) / span if out_n > 1 and span > 0 else None
        if self.spec is not None:  # "17 accepted from drafts (2.1 tokens/step)"
            m.update(self.spec.metrics(seq))
        delta = RequestOutputDelta(
            req.request_id, seq.index, text, toks, finished, reason, error, m, logprobs
        )
        if (
            req.params.prompt_logprobs is not None
            and (toks or finished)
            and not seq.prompt_logprobs_sent
        ):
            seq.prompt_logprobs_sent = (
                True  # once per sequence, with its first token (children: the parent's)
            )
            delta.prompt_logprobs = (
                seq.prompt_logprobs if seq.index == 0 else req.seqs[0].prompt_logprobs
            ) or [None] * seq.prompt_len
        self._deliver(req, delta)

    # ---- observability -----------------------------------------------------------------------
    def reset_peak_stats(self) -> None:
        self.block_pool.reset_peak()
        self.scheduler.peak_running = len(self.scheduler.running)

    def kv_stats(self) -> KVStats:
        return dataclasses.replace(
            kv_stats(self.kv),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            peak_running=self.scheduler.peak_running,
            generated_tokens_total=self.generated_tokens_total,
            prompt_tokens_computed_total=self.prompt_tokens_computed_total,
            max_model_len=self.max_model_len,
            steps=self.steps,
            kv_cache_dtype=kv_dtype_name(self.runner.kv_dtype),
            weights_kv_bytes_per_token=self.runner.weights_kv_bytes_per_token,
            **(
                {}
                if self.spec is None
                else dict(
                    spec_num_drafts=self.spec.num_drafts,
                    spec_draft_tokens=self.spec.draft_tokens,
                    spec_accepted_tokens=self.spec.accepted_tokens,
                )
            ),
        )

    def stats(self) -> dict:
        return self.kv_stats().to_json()

    def kv_snapshot(self) -> KVSnapshot:
        """The manager's snapshot plus the engine's counters and each sequence's request id
        (engine sequence ids are "<request id>#<index>")."""
        snap = take_snapshot(self.kv, request_of=lambda seq_id: str(seq_id).rsplit("#", 1)[0])
        return dataclasses.replace(snap, stats=self.kv_stats())

    def snapshot(self) -> dict:
        return self.kv_snapshot().to_json()
