"""Turn a batch of logits into next tokens in a few batched ops on the logits' device.

Why it is shaped this way: the chat's default sampling (temperature 0.7, top-p 0.95, repetition
penalty 1.1) used to sort the whole 49k vocabulary per row (~5 ms a row on CPU). Here:

* Penalties are scatters over the batch's flattened histories (no per-row Python work on logits).
* Filtering works on the top-K candidates of each row (K small, >= every row's top-k). The draw
  is an inverse CDF over the kept tokens in a canonical order (value descending, ties by lower
  token id) with ONE uniform per row from that row's own generator. The candidates are exactly the
  head of that order, so whenever the kept set and the drawn point lie inside them the result is
  the one a full sort would give. Rows where that cannot be proven (top-p mass not covered, ties
  across the candidate boundary, a pure-temperature draw landing in the tail) take the exact
  full-sort path. `sample_reference` in the tests is the straightforward per-row definition.
* That candidate path is for the CPU, where a sort of the vocabulary is the expensive part. On a
  GPU the sort is cheap and each of the path's ~125-300 small ops is a launch from Python, so there
  every row takes the full sort (uses_full_sort), in chunks of rows.
* Seeded rows stay reproducible whatever the batch: each row's uniform comes from its own
  generator and nothing else depends on the neighbours.
* Only token ids (and requested logprobs) leave the device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from engine.outputs import TokenLogprob
from kernels import cpu_sampling
from engine.sampling.sampling_params import SamplingParams
from engine.sampling.structured.bitmask import apply_bitmask_

NUM_CANDIDATES = 256  # candidates per row before the exactness checks (>= max top_k + 64)
MASS_MARGIN = 1e-4  # top-p bound must hold with this slack (float sums differ by ulps)
FULL_SORT_ELEMENTS = 1 << 23  # rows x vocabulary sorted at once on a GPU (~0.3 GB of temporaries)


def uses_full_sort(device: torch.device) -> bool:
    """Off the CPU every op is a kernel launch costing ~10-20 us of host time, and a full-row sort
    is cheap: a batch's sampling is ~125 (peaked rows) to ~300 (flat rows: retries, then the
    fallback) top-level ops on the candidate path, ~70 with the full sort. The first H200 run
    measured top-p sampling at 169 tok/s against 736 greedy at batch 1 (docs/BENCHMARKS.md). On
    the CPU it is the other way round (see above)."""
    return device.type != "cpu"


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return g


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def _draw_uniforms(generators, rows: list[int], device) -> torch.Tensor:
    """One U[0,1) per sampled row from that row's generator (CPU), then one copy to the device."""
    u = torch.cat([torch.rand(1, generator=generators[r]) for r in rows])  # fp32, < 1
    return u.to(device)


def argmax_suffices(p: SamplingParams) -> bool:
    """Whether a row with these parameters is sampled by the argmax of its logits and nothing else
    reads them: greedy, no logprobs, no bias, no penalty, no grammar. Such a step's forward may
    skip the LM head wherever a row provably cannot be the argmax (kernels/greedy_head.py)."""
    return (
        p.greedy
        and p.logprobs is None
        and not p.logit_bias
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and p.structured is None
    )


def apply_penalties(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[list[int]],
    prompt_lens: list[int] | None = None,
) -> None:
    """In place, batched. Repetition penalty (HF/CTRL rule, over prompt + output: positive logits
    divided, negative multiplied); presence and frequency penalties (OpenAI rule, over output
    tokens only: logit -= frequency * count + presence * (count > 0))."""
    B, V = logits.shape
    dev = logits.device
    flat = logits.view(-1)
    _repetition_penalty(flat, flat, V, params, histories)
    of_rows = [i for i, p in enumerate(params) if p.presence_penalty or p.frequency_penalty]
    if of_rows:
        plens = prompt_lens or [0] * B
        outs = [
            torch.as_tensor(histories[i][plens[i] :], dtype=torch.long) + i * V for i in of_rows
        ]
        idx = torch.cat(outs)
        if idx.numel():
            freq = torch.tensor([p.frequency_penalty for p in params], dtype=logits.dtype)
            pres = torch.tensor([p.presence_penalty for p in params], dtype=logits.dtype)
            uniq, counts = torch.unique(idx, return_counts=True)
            row = uniq // V
            delta = freq[row] * counts.to(logits.dtype) + pres[row]
            flat.index_put_((uniq.to(dev),), -delta.to(dev), accumulate=True)


_local = threading.local()


def _scratch(like: torch.Tensor) -> torch.Tensor:
    """A per-thread buffer for the tempered logits: a fresh vocab-wide tensor per step costs page
    faults on CPU (a third of the division's time here). Per thread, because several engines may
    sample at once; valid until this thread's next call."""
    buf = getattr(_local, "buf", None)
    if (
        buf is None
        or buf.shape != like.shape
        or buf.dtype != like.dtype
        or buf.device != like.device
    ):
        buf = _local.buf = torch.empty_like(like)
    return buf


def _repetition_penalty(dst_flat, src_flat, V: int, params, histories, temp=None) -> None:
    """dst[i, t] = penalised(src[i, t]) (/ temp[i] if given) for t in row i's history."""
    rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0 and histories[i]]
    if not rep_rows:
        return
    dev = dst_flat.device
    # duplicates are harmless: every write of a slot stores the same value
    idx = torch.cat([torch.as_tensor(histories[i], dtype=torch.long) + i * V for i in rep_rows]).to(
        dev
    )
    row = idx // V
    pen = torch.tensor([p.repetition_penalty for p in params], dtype=dst_flat.dtype).to(dev)[row]
    seen = src_flat[idx]
    new = torch.where(seen > 0, seen / pen, seen * pen)
    dst_flat[idx] = new if temp is None else new / temp[row]


def _canonical(vals: torch.Tensor, idx: torch.Tensor):
    """Order [R, K] candidates by value descending, ties by lower token id (topk leaves ties in
    an unspecified order)."""
    o = idx.argsort(-1)
    vals, idx = vals.gather(-1, o), idx.gather(-1, o)
    vals, o = vals.sort(dim=-1, descending=True, stable=True)
    return vals, idx.gather(-1, o)


def _keep_mask(
    vals: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    lse: torch.Tensor,
):
    """Which sorted candidates survive top-k, top-p and min-p, and their probabilities.
    vals [R, K] in canonical order; top_k [R] in 1..K; lse [R]: normaliser of the top-k-masked row."""
    K = vals.shape[1]
    pos = torch.arange(K, device=vals.device)
    kth = vals.gather(-1, (top_k - 1)[:, None])
    keep = vals >= kth  # ties at the k-th value are kept (reference rule)
    probs = (vals.masked_fill(~keep, float("-inf")) - lse[:, None]).exp()
    before = probs.cumsum(-1) - probs
    keep &= (before < top_p[:, None]) | (pos == 0)
    keep &= probs >= min_p[:, None] * probs[:, :1]
    return keep, probs * keep


def _invert(probs: torch.Tensor, ids: torch.Tensor, u: torch.Tensor, total=None) -> torch.Tensor:
    """Inverse CDF: the first kept position whose cumulative mass exceeds u * total."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1] if total is None else total
    j = torch.searchsorted(cdf, (u * total)[:, None], right=True)
    last = (cdf < cdf[:, -1:]).sum(-1, keepdim=True)  # first position holding all kept mass
    return ids.gather(-1, torch.minimum(j, last)).squeeze(-1)


def _sample_rows_exact(l: torch.Tensor, top_k, top_p, min_p, u: torch.Tensor) -> torch.Tensor:
    """Full-sort path for [R, V] rows: the definition the fast path reproduces."""
    R, V = l.shape
    vals, order = l.sort(dim=-1, descending=True, stable=True)  # ties: lower token id first
    tk = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    kth = vals.gather(-1, (tk - 1)[:, None])
    lse = torch.logsumexp(vals.masked_fill(vals < kth, float("-inf")), -1)
    keep, probs = _keep_mask(vals, tk, top_p, min_p, lse)
    return _invert(probs, order, u)


def _sample_rows_full_sort(l: torch.Tensor, top_k, top_p, min_p, u: torch.Tensor) -> torch.Tensor:
    """The full-sort path in chunks of rows, so a large batch does not sort it all at once."""
    step = max(1, FULL_SORT_ELEMENTS // l.shape[1])
    if l.shape[0] <= step:
        return _sample_rows_exact(l, top_k, top_p, min_p, u)
    return torch.cat(
        [
            _sample_rows_exact(
                l[i : i + step],
                top_k[i : i + step],
                top_p[i : i + step],
                min_p[i : i + step],
                u[i : i + step],
            )
            for i in range(0, l.shape[0], step)
        ]
    )


def _sample_rows(
    l: torch.Tensor, ps: list[SamplingParams], u: torch.Tensor, K: int = NUM_CANDIDATES
) -> torch.Tensor:
    """l: [R, V] temperature-scaled logits of the rows that sample. Fast path with exact fallback:
    rows the K candidates cannot decide retry with 16x more candidates, then the full sort.
    Off the CPU the full sort directly (uses_full_sort)."""
    R, V = l.shape
    dev = l.device
    top_k = torch.tensor([min(p.top_k, V) if p.top_k > 0 else 0 for p in ps], device=dev)
    top_p = torch.tensor([p.top_p for p in ps], device=dev, dtype=l.dtype)
    min_p = torch.tensor([p.min_p for p in ps], device=dev, dtype=l.dtype)
    if uses_full_sort(dev):
        return _sample_rows_full_sort(l, top_k, top_p, min_p, u)
    K = min(V, max([K] + [p.top_k + 64 for p in ps if p.top_k > 0]))
    if K >= V:
        return _sample_rows_exact(l, top_k, top_p, min_p, u)
    # candidates and the row normaliser: one compiled pass on CPU (kernels/cpu_sampling.py), else
    # topk + one fused, row-parallel log_softmax (on a busy CPU every separate full-width op costs
    # a scheduling slice; logsumexp is four of them)
    stats = cpu_sampling.row_stats(l, K) if l.device.type == "cpu" else None
    lsm = None
    if stats is not None:
        cand_vals, cand_idx, lse_full = stats
        vals, idx = _canonical(cand_vals, cand_idx)
    else:
        vals, idx = _canonical(*l.topk(K, -1))
        lsm = torch.log_softmax(l, -1)
        top1 = idx[:, :1]
        lse_full = (l.gather(-1, top1) - lsm.gather(-1, top1)).squeeze(-1)
    has_k = top_k > 0
    tk = torch.where(has_k, top_k, torch.full_like(top_k, K))
    kth = vals.gather(-1, (tk - 1)[:, None]).squeeze(-1)
    # top-k rows are normalised over their kept set (inside the candidates when k_ok), others
    # over the whole row
    lse = torch.where(
        has_k, torch.logsumexp(vals.masked_fill(vals < kth[:, None], float("-inf")), -1), lse_full
    )
    keep, probs = _keep_mask(vals, tk, top_p, min_p, lse)
    tail = vals[:, -1]
    # topk picks an arbitrary subset of the tokens tied with its last value, so only positions
    # strictly above the tail value are known to be the head of the canonical order ("trusted")
    trusted = vals > tail[:, None]
    # rows whose kept set provably lies inside the trusted candidates
    k_ok = has_k & (tail < kth)  # no tie across the boundary
    mass = ((vals - lse_full[:, None]).exp() * trusted).sum(-1)
    p_ok = ~has_k & (top_p < 1) & (mass >= top_p + MASS_MARGIN)  # the nucleus closes inside
    m_ok = ~has_k & (min_p > 0) & (tail - vals[:, 0] < torch.log(min_p.clamp_min(1e-30)) - 1e-4)
    closed = k_ok | p_ok | m_ok
    # unfiltered rows keep the whole row (total mass ~1): the candidates decide the draw iff the
    # drawn point falls inside the trusted mass
    open_ = ~has_k & (top_p >= 1) & (min_p <= 0)
    cdf_last = probs.cumsum(-1)[:, -1]
    total = cdf_last
    if bool(open_.any()):  # one more pass over the vocabulary, only for unfiltered rows
        whole = lsm.exp().sum(-1) if lsm is not None else (l - lse_full[:, None]).exp().sum(-1)
        total = torch.where(closed, cdf_last, whole)
    ok = closed | (open_ & (u * total < (probs * trusted).sum(-1) * (1 - 1e-5)))
    out = _invert(probs, idx, u, total)
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()
        if K * 16 <= V // 4:
            out[bad] = _sample_rows(l[bad], [ps[i] for i in bad.tolist()], u[bad], K * 16)
        else:
            out[bad] = _sample_rows_exact(l[bad], top_k[bad], top_p[bad], min_p[bad], u[bad])
    return out


def _logprobs(logits: torch.Tensor, rows: list[int], ks: list[int], tokens: torch.Tensor):
    lp = logits[rows].float().log_softmax(-1)
    chosen = lp.gather(-1, tokens[rows][:, None]).squeeze(-1).tolist()
    kmax = max(ks)
    tv, ti = lp.topk(kmax, -1) if kmax else (lp[:, :0], lp[:, :0].long())
    tv, ti = tv.tolist(), ti.tolist()
    tok = tokens[rows].tolist()
    return [
        TokenLogprob(t, c, tuple(zip(ti[j][:k], tv[j][:k])))
        for j, (t, c, k) in enumerate(zip(tok, chosen, ks))
    ]


def _apply_logit_bias_(l: torch.Tensor, params: list[SamplingParams]) -> None:
    """In place, one scatter for the whole batch: l[i, t] += params[i].logit_bias[t]."""
    rows, cols, vals = [], [], []
    for i, p in enumerate(params):
        for t, b in (p.logit_bias or {}).items():
            rows.append(i)
            cols.append(t)
            vals.append(b)
    if max(cols) >= l.shape[1]:
        raise ValueError(
            f"logit_bias: token id {max(cols)} is outside the vocabulary (0..{l.shape[1] - 1})"
        )
    dev = l.device
    l.index_put_(
        (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)),
        torch.tensor(vals, dtype=l.dtype, device=dev),
        accumulate=True,
    )


@torch.inference_mode()
def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    histories: list[list[int]],
    prompt_lens: list[int] | None = None,
    constraint: tuple[list[int], torch.Tensor] | None = None,
) -> SamplerOutput:
    """logits: [B, vocab] (any float dtype, any device). histories: prompt + output ids per row.
    constraint: (rows, packed int32 bitmask [len(rows), words]) from engine/sampling/structured: those rows
    may only draw allowed tokens. Logit bias and the mask shape the logits every rule below sees;
    reported logprobs stay those of the raw logits (see TokenLogprob)."""
    B, V = logits.shape
    raw = logits
    l = logits.float()
    biased = any(p.logit_bias for p in params)
    if biased or (constraint is not None and constraint[0]):
        # logprobs report the raw logits, and a retried row must not get its bias twice; a mask
        # alone is idempotent, so it is applied in place (one vocab-wide pass fewer)
        if l is logits and (biased or any(p.logprobs is not None for p in params)):
            l = l.clone()
        if biased:
            _apply_logit_bias_(l, params)
        if constraint is not None:
            apply_bitmask_(l, *constraint)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if len(rows) == B and not any(p.presence_penalty or p.frequency_penalty for p in params):
        # the common chat batch: every row samples, repetition penalty at most. The tempered copy
        # is made straight from the raw logits and the penalised slots are rewritten in it
        # (penalise, then divide: the same two roundings as below), saving a vocab-wide clone.
        temp = torch.tensor([p.temperature for p in params], device=l.device, dtype=l.dtype)
        sub = torch.div(l, temp[:, None], out=_scratch(l))
        _repetition_penalty(sub.view(-1), l.reshape(-1), V, params, histories, temp)
        u = _draw_uniforms(generators, rows, l.device)
        tokens = _sample_rows(sub, params, u)
        return SamplerOutput(tokens.tolist(), _all_logprobs(raw, params, tokens))
    if l is logits and any(
        p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty for p in params
    ):
        l = l.clone()  # penalties work in place; logprobs need the raw logits
    apply_penalties(l, params, histories, prompt_lens)
    if not rows:  # all greedy: one argmax, no scatter through an index list (an upload on CUDA)
        tokens = l.argmax(-1)
        return SamplerOutput(tokens.tolist(), _all_logprobs(raw, params, tokens))
    tokens = torch.zeros(B, dtype=torch.long, device=l.device)
    if len(rows) < B:  # greedy rows: argmax of the penalised logits
        g = [i for i, p in enumerate(params) if p.greedy]
        tokens[g] = l[g].argmax(-1)
    if rows:
        temp = torch.tensor([params[i].temperature for i in rows], device=l.device, dtype=l.dtype)
        sub = (l if len(rows) == B else l[rows]) / temp[:, None]
        u = _draw_uniforms(generators, rows, l.device)
        tokens[rows] = _sample_rows(sub, [params[i] for i in rows], u)
    return SamplerOutput(tokens.tolist(), _all_logprobs(raw, params, tokens))


def _all_logprobs(raw: torch.Tensor, params, tokens: torch.Tensor) -> list[TokenLogprob | None]:
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    lps: list[TokenLogprob | None] = [None] * len(params)
    if lp_rows:
        for i, t in zip(
            lp_rows, _logprobs(raw, lp_rows, [params[i].logprobs for i in lp_rows], tokens)
        ):
            lps[i] = t
    return lps


def sample(logits, params, generators, histories, prompt_lens=None) -> list[int]:
    """Token ids only (see sample_batch)."""
    return sample_batch(logits, params, generators, histories, prompt_lens).token_ids
