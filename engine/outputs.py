"""vLLM-shaped result objects returned by LLM.generate / LLM.chat, and the states a request's
stream reports in each delta's `metrics["state"]`."""

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
    reasoning: str | None = (
        None  # a thinking model's reasoning (engine/text/reasoning.py); None: none
    )
    content: str | None = None  # the reply without its reasoning block (None: not split)
    reasoning_tokens: int = 0  # generated tokens inside the reasoning block


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[TokenLogprob | None] | None = (
        None  # per prompt token (first: None), if asked
    )


# The life-cycle states a stream reports in `RequestOutputDelta.metrics["state"]`. Defined once here
# because the engine emits them and every consumer (chat UI, OpenAI routes, benches) reads them.
# Why the stream carries preemption at all: only the engine knows when it takes a request's blocks
# away; a UI guessing it from "no token for a while" cannot tell a pause from a slow step and misses
# short pauses. A request preempted by recompute gets one delta in state PREEMPTED (no text, no
# tokens) and, when the scheduler runs it again, one in state RESUMED; its tokens then follow.
STATE_RUNNING = "running"  # admitted (first delta, before any token) or producing tokens
STATE_PREEMPTED = "preempted"  # its KV blocks were taken for another request; it waits to resume
STATE_RESUMED = "resumed"  # scheduled again after a preemption (recomputing, then tokens)
STATE_FINISHED = "finished"


def is_state_only(delta) -> bool:
    """A delta that only reports a state change (no text, no tokens, not the end). Consumers that
    forward text (SSE chunks) skip these; consumers that show progress use them."""
    return not (delta.text or delta.token_ids or delta.finished)
