"""vLLM-shaped result objects returned by LLM.generate / LLM.chat."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """log_softmax of the raw fp32 logits (before penalties, temperature and filters) for the
    sampled token, plus the top alternatives as (token_id, logprob), best first."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: dict = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
