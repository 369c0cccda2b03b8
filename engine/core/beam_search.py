"""Beam search as forks and frees of paged sequences (copy-on-write does the rest).

Why it lives beside the engine rather than in the sampler: a beam step is not a per-row choice.
It needs the rows of *all* beams of one prompt at once (top `beam_width` candidates across them),
and its outcome is a change of the set of sequences: a beam with several children forks (every
block shared, refcount + 1), a beam with no child is freed at once, and the next step's
`allocate_slots` copies a shared *partial* last block only for children that write into it.
So the engine hands a beam group its rows' fp32 logits (one hook in `LLMEngine.step`) and the
group edits the KV manager and the scheduler between steps.

Scoring follows HF transformers' beam search (5.x) so results can be checked against it:
candidates = top max(2, 1 + #eos) x k of (beam cumulative logprob + log_softmax(logits)) in fp32;
an EOS candidate ranked in the top k becomes a finished hypothesis scored
`sum_logprobs / gen_len ** length_penalty` (gen_len counts generated tokens, EOS included); at
`max_tokens` the top k candidates all finish; the best k finished hypotheses are kept and the
early_stopping rule (True / False / "never") decides when no running beam can still win.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from engine.text.detokenizer import IncrementalDetokenizer, decode_keeping
from engine.core.sequence import Request, Sequence, SeqStatus


@dataclass
class BeamSearchParams:
    """vLLM-shaped. temperature > 0 divides the logits before log_softmax (a deterministic search
    over the tempered distribution; HF ignores temperature when do_sample=False). early_stopping
    is HF's knob, default False like HF's."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False
    temperature: float = 0.0
    early_stopping: bool | str = False

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"BeamSearchParams.{name} {why} (got {getattr(self, name)!r})")

        if (
            not isinstance(self.beam_width, int)
            or isinstance(self.beam_width, bool)
            or self.beam_width < 1
        ):
            bad("beam_width", "must be an integer >= 1")
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            bad("max_tokens", "must be an integer >= 1")
        if (
            not isinstance(self.length_penalty, (int, float))
            or self.length_penalty != self.length_penalty
        ):
            bad("length_penalty", "must be a number")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            bad("temperature", "must be >= 0 (0 means no scaling)")
        if self.early_stopping not in (True, False, "never"):
            bad("early_stopping", "must be True, False or 'never'")
        if self.early_stopping != "never":
            self.early_stopping = bool(self.early_stopping)  # the stop rule tests `is True`


@dataclass(frozen=True)
class BeamSearchSequence:
    token_ids: tuple[int, ...]  # generated tokens only (EOS included when it ended the beam)
    logprobs: tuple[float, ...]  # per generated token, log_softmax of the fp32 logits
    cum_logprob: float  # sum of logprobs (fp32 running sum, as HF)
    score: float  # cum_logprob / len(token_ids) ** length_penalty
    text: str
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass
class BeamSearchOutput:
    request_id: str
    prompt_token_ids: list[int]
    sequences: list[BeamSearchSequence]  # best first
    stats: dict = field(default_factory=dict)  # steps, forks, frees, partial_block_divergences


@dataclass(frozen=True)
class BeamStepEvent:
    """What one step did, for a live view (called in the engine thread; keep the callback cheap)."""

    request_id: str
    step: int  # generated tokens per running beam after the step
    beams: tuple[tuple[str, tuple[int, ...], float], ...]  # (seq_id, generated ids, cum logprob)
    forked: tuple[tuple[str, str, int], ...]  # (parent seq_id, child seq_id, parent context len)
    freed: tuple[str, ...]
    num_finished: int
    done: bool


# ---- the KV part of a step: pure enough to property-test against the real manager -------------
def reshape_beams(
    kv, beams: list, picks: list[tuple[int, int]], new_child
) -> tuple[list, list, list]:
    """Turn live `beams` (objects with .seq_id and .token_ids) into one beam per pick.

    picks: (parent index, new token) in rank order. A parent's first pick reuses the parent; each
    further pick forks it (child shares every block); parents without picks are freed at once.
    Forks happen before any token is appended, so children copy the parent's history only.
    A parent whose KV was released (it waited for a preempted sibling) has nothing to share or
    free in the manager: its children start as plain token lists and are recomputed.
    new_child(parent) must return a new beam object with a fresh seq_id and a copy of
    parent.token_ids. Returns (new beams in pick order, [(parent, child)], freed beams)."""
    taken: set[int] = set()
    out, forked = [], []
    for p, _ in picks:
        parent = beams[p]
        if p not in taken:
            taken.add(p)
            out.append(parent)
            continue
        child = new_child(parent)
        if kv.has_sequence(parent.seq_id):
            kv.fork(parent.seq_id, child.seq_id, child.token_ids)
        forked.append((parent, child))
        out.append(child)
    freed = [b for i, b in enumerate(beams) if i not in taken]
    for b in freed:
        if kv.has_sequence(b.seq_id):
            kv.free(b.seq_id)
    for beam, (_, tok) in zip(out, picks):
        beam.token_ids.append(tok)
    return out, forked, freed


class _Beam:
    __slots__ = ("seq", "cum", "logprobs")

    def __init__(self, seq: Sequence, cum: float, logprobs: list[float]):
        self.seq, self.cum, self.logprobs = seq, cum, logprobs


class BeamGroup:
    """The running beams and finished hypotheses of one prompt. Engine thread only."""

    def __init__(
        self,
        request: Request,
        params: BeamSearchParams,
        eos_ids: set[int],
        max_new: int,
        tokenizer,
        block_size: int,
        on_step=None,
    ):
        self.req, self.p, self.tokenizer, self.bs = request, params, tokenizer, block_size
        self.eos = set() if params.ignore_eos else set(eos_ids)
        self.max_new = max_new
        self.on_step = on_step
        self.future: Future = Future()
        self.beams: list[_Beam] = []
        self.finished: list[tuple[float, BeamSearchSequence]] = []  # best first, at most k
        self.rows: dict[str, torch.Tensor] = {}  # logits rows waiting for the rest of the group
        self.improvable = True  # HF's "early stop heuristic unsatisfied"
        self.generated = 0
        self._next_index = 1
        self.stats = {
            "steps": 0,
            "forks": 0,
            "frees": 0,
            "partial_block_divergences": 0,
            "stalls": 0,
        }
        self.on_started = (
            None  # called once when its first step ran or it ended (admission's "leave")
        )

    def _started(self) -> None:
        cb, self.on_started = self.on_started, None
        if cb is not None:
            cb()

    # ---- engine-thread entry points ----------------------------------------------------------
    def start(self, engine) -> None:
        req = self.req
        root = self._sequence(0, list(req.prompt_ids))
        self.beams = [_Beam(root, 0.0, [])]
        req.seqs[:] = [root]
        engine.scheduler.add(root)

    def _sequence(self, index: int, token_ids: list[int]) -> Sequence:
        detok = IncrementalDetokenizer(self.tokenizer, self.req.prompt_ids[-6:])
        return Sequence(f"{self.req.request_id}#{index}", self.req, index, token_ids, detok, None)

    def on_logits(self, engine, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Rows for some beams. Select once every live beam has one. Until then the ones that
        reported keep only their row: they leave the scheduler and release their KV, because the
        missing sibling (preempted, or not scheduled for lack of token budget) may need exactly
        those blocks to catch up; holding them could stall the pool forever. Their full blocks
        stay in the prefix cache, so continuing later recomputes little more than the tail."""
        self._started()
        for s, row in zip(seqs, logits):
            self.rows[s.seq_id] = row.clone()  # a CUDA graph's logits are reused next step
        if any(b.seq.seq_id not in self.rows for b in self.beams):
            self.stats["stalls"] += 1
            for s in seqs:
                engine.scheduler.remove(s)
                if engine.kv.has_sequence(s.seq_id):
                    engine.kv.free(s.seq_id)
                s.status = SeqStatus.WAITING  # the manager forgot it: recomputed on re-admission
            return
        rows = torch.stack([self.rows.pop(b.seq.seq_id) for b in self.beams]).float()
        self._step(engine, rows)

    def abort(self, reason: str, error: str | None) -> None:
        """The engine already freed the beams' blocks (abort_request); fail the caller's future."""
        if not self.future.done():
            self.future.set_exception(RuntimeError(error or f"beam search {reason}ed"))

    # ---- one beam step ------------------------------------------------------------------------
    def _step(self, engine, logits: torch.Tensor) -> None:
        p, k = self.p, self.p.beam_width
        self.req.forked = True  # from now on the scheduler counts each beam as one
        if p.temperature > 0:
            logits = logits / p.temperature
        logp = torch.log_softmax(logits, dim=-1)  # fp32, [B, V]
        B, V = logp.shape
        cum = torch.tensor([b.cum for b in self.beams], dtype=torch.float32)
        total = (logp + cum[:, None]).reshape(-1)
        n_keep = min(max(2, 1 + len(self.eos)) * k, total.numel())
        vals, idx = torch.topk(total, n_keep)
        parents, toks = (idx // V).tolist(), (idx % V).tolist()
        vals_l = vals.tolist()
        t = self.generated + 1
        last = t >= self.max_new
        can_add = self.improvable and not (p.early_stopping is True and len(self.finished) >= k)
        picks = []
        new_fin = []
        for i in range(n_keep):
            tok = toks[i]
            hit = tok in self.eos
            if hit or last:
                if i < k and can_add:
                    new_fin.append((i, "stop" if hit else "length"))
            elif len(picks) < k:
                picks.append(i)
        for i, reason in new_fin:
            b = self.beams[parents[i]]
            score = float(vals[i : i + 1] / (t**p.length_penalty))
            ids = tuple(b.seq.output_ids) + (toks[i],)
            seq = BeamSearchSequence(
                ids,
                tuple(b.logprobs) + (float(logp[parents[i], toks[i]]),),
                vals_l[i],
                score,
                "",
                reason,
            )
            self.finished.append((score, seq))
        self.finished.sort(key=lambda x: -x[0])  # stable: earlier hypotheses win ties, like HF
        del self.finished[k:]
        self.generated = t
        self.stats["steps"] += 1
        if last or not picks:
            self._finish(engine)
            return
        self._update_improvable(vals_l[picks[0]], t)
        done = not self.improvable or (p.early_stopping is True and len(self.finished) >= k)
        if done:
            self._finish(engine)
            return
        self._advance(
            engine,
            [(parents[i], toks[i], vals_l[i], float(logp[parents[i], toks[i]])) for i in picks],
        )

    def _update_improvable(self, best_running: float, t: int) -> None:
        """HF's rule: stop once all k slots hold hypotheses and the best running beam, scored at
        its best attainable length, cannot beat the worst of them."""
        if not self.improvable or len(self.finished) < self.p.beam_width:
            return
        lp = self.p.length_penalty
        length = self.max_new if (self.p.early_stopping == "never" and lp > 0) else t
        best = float(torch.tensor([best_running], dtype=torch.float32) / (length**lp))
        self.improvable = best > self.finished[-1][0]

    def _advance(self, engine, picks: list[tuple[int, int, float, float]]) -> None:
        sched, bs = engine.scheduler, self.bs
        old = self.beams

        def new_child(parent_seq: Sequence) -> Sequence:
            child = self._sequence(self._next_index, list(parent_seq.token_ids))
            self._next_index += 1
            return child

        new_seqs, forked, freed = reshape_beams(
            engine.kv, [b.seq for b in old], [(pi, tok) for pi, tok, _, _ in picks], new_child
        )
        for s in freed:
            sched.remove(s)
            s.status = SeqStatus.FINISHED
        fork_points = []
        for parent, child in forked:
            child.cached_tokens = parent.cached_tokens
            if engine.kv.has_sequence(child.seq_id):  # shares the parent's blocks: runs next to it
                sched.add_forked(parent, child)
                computed = engine.kv.num_computed(parent.seq_id)
                fork_points.append((parent.seq_id, child.seq_id, computed))
                if computed % bs:  # both will write into a shared partial block
                    self.stats["partial_block_divergences"] += 1
            else:
                fork_points.append((parent.seq_id, child.seq_id, 0))
        for s in reversed([s for s in new_seqs if not engine.kv.has_sequence(s.seq_id)]):
            sched.requeue_first(s)  # released while waiting: recomputed,
        self.stats["forks"] += len(forked)
        self.stats["frees"] += len(freed)
        beams = []
        for s, (pi, tok, cum, lp) in zip(new_seqs, picks):
            beams.append(_Beam(s, cum, old[pi].logprobs + [lp]))
        self.beams = beams
        self.req.seqs[:] = new_seqs
        self._notify(engine, fork_points, freed, done=False)

    def _finish(self, engine) -> None:
        for b in self.beams:
            engine.scheduler.remove(b.seq)
            if engine.kv.has_sequence(b.seq.seq_id):
                engine.kv.free(b.seq.seq_id)
            b.seq.status = SeqStatus.FINISHED
        freed = [b.seq for b in self.beams]
        self.stats["frees"] += len(freed)
        self.beams = []
        self.req.seqs[:] = []
        engine.end_driven_request(self.req.request_id)
        seqs = [
            BeamSearchSequence(
                s.token_ids,
                s.logprobs,
                s.cum_logprob,
                s.score,
                decode_keeping(self.tokenizer, s.token_ids, engine.kept_markers),
                s.finish_reason,
            )
            for _, s in self.finished
        ]
        self._notify(engine, [], freed, done=True)
        if not self.future.done():
            self.future.set_result(
                BeamSearchOutput(
                    self.req.request_id, list(self.req.prompt_ids), seqs, dict(self.stats)
                )
            )

    def _notify(self, engine, forked, freed, done: bool) -> None:
        if self.on_step is None:
            return
        ev = BeamStepEvent(
            self.req.request_id,
            self.generated,
            tuple((b.seq.seq_id, tuple(b.seq.output_ids), b.cum) for b in self.beams),
            tuple(forked),  # (parent seq id, child seq id, tokens computed)
            tuple(s.seq_id for s in freed),
            len(self.finished),
            done,
        )
        try:
            self.on_step(ev)
        except Exception as e:  # a broken viewer ends this search only
            self.on_step = None
            if not done:
                engine.abort_request(
                    self.req.request_id, reason="abort", error=f"on_step raised {e!r}"
                )


# ---- engine hooks ---------------------------------------------------------------------------------
def add_beam_request(engine, group: BeamGroup) -> None:
    """Admit one beam search (engine thread) as a driven request. Bad input fails this search's
    future only."""
    try:
        engine.add_driven_request(group.req, group)
    except Exception as e:
        group.future.set_exception(e)
