"""SamplingParams: what a request asks for, validated up front so bad values fail that request only.

Every number must be finite and in range: NaN slips through plain comparisons (`nan < 0` is False)
and a tiny temperature such as 1e-40 overflows logits / temperature to inf, and either one would
reach `torch.multinomial` inside the shared engine step. Temperature is therefore 0 (greedy) or at
least MIN_TEMPERATURE; booleans are not accepted where numbers are meant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.sampling.structured.spec import StructuredSpec

MIN_TEMPERATURE = 1e-5  # below this (but > 0) logits / T overflows fp32; use 0 for greedy
MAX_TEMPERATURE = 100.0  # far past any useful value; keeps logits / T finite
MAX_REPETITION_PENALTY = 100.0
MAX_N = 128  # children per request (OpenAI's cap): each one holds KV blocks
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 1000  # every stop string is checked after every token
MAX_LOGIT_BIAS = 300  # entries (OpenAI's cap); each value in [-100, 100], added to the logit


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # OpenAI rule, output tokens: logit -= presence * (count > 0)
    frequency_penalty: float = 0.0  # OpenAI rule, output tokens: logit -= frequency * count
    logprobs: int | None = None  # None: none; k in 0..20: sampled token's + top-k alternatives
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    structured: StructuredSpec | None = None  # constrained decoding (engine/sampling/structured/)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    prompt_logprobs: int | None = (
        None  # k: each prompt token's logprob + k alternatives (recomputed)
    )
    speculative: bool = True  # False: never draft for this request (engine --speculative)

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SamplingParams.{name} {why} (got {getattr(self, name)!r})")

        for name in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                bad(name, "must be a finite number")
        for name in ("n", "top_k", "max_tokens"):
            if not _is_int(getattr(self, name)):
                bad(name, "must be an integer")
        if not 1 <= self.n <= MAX_N:
            bad("n", f"must be an integer in [1, {MAX_N}]")
        if self.temperature != 0 and not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            bad(
                "temperature",
                f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]",
            )
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < 1 and self.top_k != -1:
            bad("top_k", "must be -1 (off) or an integer >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            bad("repetition_penalty", f"must be in (0, {MAX_REPETITION_PENALTY:g}]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, "must be in [-2, 2]")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20
        ):
            bad("logprobs", "must be None or an integer in 0..20")
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= 20
        ):
            bad("prompt_logprobs", "must be None or an integer in 0..20")
        if self.structured is not None and not isinstance(self.structured, StructuredSpec):
            bad("structured", "must be a StructuredSpec")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > MAX_LOGIT_BIAS:
                bad(
                    "logit_bias",
                    f"must be a dict of at most {MAX_LOGIT_BIAS} token id -> bias entries",
                )
            for t, b in self.logit_bias.items():
                if not _is_int(t) or t < 0 or not _is_number(b) or not -100 <= b <= 100:
                    bad("logit_bias", "must map non-negative token ids to numbers in [-100, 100]")
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()} or None
        if self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if self.seed is not None and not _is_int(self.seed):
            bad("seed", "must be an integer or None")
        if not all(
            isinstance(v, bool)
            for v in (self.ignore_eos, self.skip_special_tokens, self.speculative)
        ):
            raise ValueError(
                "SamplingParams.ignore_eos, skip_special_tokens and speculative must be booleans"
            )
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            bad("stop", "must be a string or a list of strings")
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        self.stop = [s for s in (self.stop or []) if s]
        if any(not isinstance(s, str) for s in self.stop):
            bad("stop", "must be a string or a list of strings")
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(
                f"SamplingParams.stop allows at most {MAX_STOP_STRINGS} strings of at most "
                f"{MAX_STOP_CHARS} characters"
            )
        self.stop_token_ids = list(self.stop_token_ids or [])
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of non-negative token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
