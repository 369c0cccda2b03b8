"""When a draft pays, and how long it should be: acceptance per request, cost per step, measured.

Verifying k draft tokens adds k tokens to a step. That is nearly free when a step is bound by
per-step overhead (one chat on a CPU: ~45 ms a step, a few ms per extra token) and a loss when the
step is bound by per-token work (a large batch), or when the drafts are mostly wrong. So:

* `StepCost` fits step time = a + b x tokens over recent decode steps (exponentially forgetting
  least squares, pulled toward a prior slope until steps of different sizes have been seen).
* `Acceptance` estimates, per request, the chance p that a draft token is right. Real verifications
  count accepted tokens and the one rejection; "shadow" checks count too: a draft proposed but not
  verified is compared with the token the model then produced, so a request that stopped
  speculating keeps learning at no cost and can start again.
* The rule. One step makes B tokens in a + b x T seconds (T tokens scored), so throughput is
  R = B / (a + b T). Adding the j-th draft token of a request costs b seconds and yields p^j
  expected tokens; it pays when p^j > b x R. The draft length is the largest such j (at most
  `max_k`), 0 when even the first does not pay. At one chat on a CPU, b x R ~ 0.1; at batch 32 it
  nears 1 and speculation switches itself off unless drafts are nearly always right.
* A safety factor (SAFETY) on b x R, calibrated by `python -m bench --speculative`: at batch 32 a
  draft token measured ~1.7x the fitted slope (its logits row, sampling row and history are per-row
  costs the token-count fit spreads over every token), and in a closed batch the step count is set
  by the requests that cannot draft, so tokens saved by the others do not all shorten the run.
* Above MAX_BATCH running sequences nobody drafts (vLLM has the same switch,
  `disable_by_batch_size`): measured at batch 32 on this CPU, drafts accepted at 81% still cost
  ~5% of throughput, because the run's length is set by requests that cannot draft. When such a
  batch drains below the cutoff, its stragglers (the critical path) speculate again.
"""

from __future__ import annotations

import math

PRIOR_P = 0.5  # a new request's acceptance guess (pseudo-counts below)
PRIOR_TRIALS = 2.0
DECAY = 0.9  # per observation: the last ~10 verifications dominate
PRIOR_SLOPE = 0.1  # b guessed as this fraction of the mean per-token step time, until fitted
SAFETY = 2.0  # a draft token must pay back twice its fitted cost (see the module)
MAX_BATCH = 16  # above this many running sequences nobody drafts (see the module)


class StepCost:
    """Online fit of a decode step's seconds against the tokens it scored."""

    def __init__(self, forget: float = 0.98):
        self.forget = forget
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        f = self.forget
        self.w = self.w * f + 1
        self.sx = self.sx * f + tokens
        self.sy = self.sy * f + seconds
        self.sxx = self.sxx * f + tokens * tokens
        self.sxy = self.sxy * f + tokens * seconds

    @property
    def ready(self) -> bool:
        return self.w >= 3

    def fit(self) -> tuple[float, float]:
        """(a, b): seconds per step and per scored token. The slope is a ridge estimate pulled
        toward PRIOR_SLOPE x (mean seconds / mean tokens), so equal-sized steps do not divide by 0."""
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        cov = self.sxy / self.w - mx * my
        prior = PRIOR_SLOPE * my / max(mx, 1.0)
        lam = 1.0  # pseudo-variance of one token^2
        b = max(0.0, (cov + lam * prior) / (var + lam))
        a = max(0.0, my - b * mx)
        return a, b


class Acceptance:
    """Per-request estimate of p = P(a draft token is accepted | the ones before it were)."""

    __slots__ = ("acc", "trials", "drafted", "accepted", "verify_steps")

    def __init__(self):
        self.acc, self.trials = PRIOR_P * PRIOR_TRIALS, PRIOR_TRIALS
        self.drafted = self.accepted = self.verify_steps = 0

    def _add(self, acc: float, trials: float) -> None:
        self.acc = self.acc * DECAY + acc
        self.trials = self.trials * DECAY + trials

    def verified(self, k: int, accepted: int) -> None:
        self.drafted += k
        self.accepted += accepted
        self.verify_steps += 1
        self._add(accepted, accepted + (accepted < k))

    def shadow(self, hit: bool) -> None:
        self._add(float(hit), 1.0)

    @property
    def p(self) -> float:
        return self.acc / self.trials if self.trials > 0 else 0.0


def draft_length(p: float, a: float, b: float, batch: int, tokens: int, max_k: int) -> int:
    """The largest j <= max_k with p^j > SAFETY x b x R (R = batch / (a + b x tokens)); see the module."""
    if max_k <= 0 or p <= 0.0 or batch > MAX_BATCH:
        return 0
    step = a + b * tokens
    if step <= 0 or b <= 0:
        return max_k
    bar = SAFETY * b * batch / step
    if bar >= 1.0 or p <= bar:
        return 0
    if p >= 1.0:
        return max_k
    return max(0, min(max_k, int(math.log(bar) / math.log(p))))
