"""Request and Sequence state. A request with n > 1 owns n sequences after its prompt is prefilled."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.text.detokenizer import IncrementalDetokenizer
from engine.sampling.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One stream of tokens. `token_ids` is the list the KV manager hashes from (prompt + output)."""

    def __init__(
        self,
        seq_id: str,
        request: "Request",
        index: int,
        token_ids: list[int],
        detok: IncrementalDetokenizer,
        generator,
    ):
        self.seq_id = seq_id
        self.request = request
        self.index = index
        self.token_ids = token_ids
        self.detok = detok
        self.generator = generator
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None
        self.cached_tokens = 0  # prompt tokens served from the prefix cache / session at admission
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.grammar = (
            None  # engine.sampling.structured.state.GrammarState when the request is constrained
        )
        self.prompt_logprobs: list | None = None  # [None, TokenLogprob, ...] when the request asked
        self.prompt_logprobs_sent = False
        self.draft: list[
            int
        ] = []  # speculative tokens scored this step, never in token_ids (engine/core/speculation.py)
        self.spec = None  # engine.core.speculation.SpecState once the sequence has drafted

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


@dataclass
class RequestOutputDelta:
    """What the engine streams out for one sequence after a step."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)
    logprobs: list | None = None  # list[TokenLogprob] for token_ids, when the request asked
    prompt_logprobs: list | None = (
        None  # once, with the first token: [None, TokenLogprob, ...] per prompt token
    )


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    session_id: str | None = None
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.time)
    on_output: object = None  # callable(RequestOutputDelta) set by the front
    seqs: list[Sequence] = field(default_factory=list)
    forked: bool = False
    tenant: str = "local"  # who is served (engine/core/fairness.py): user, API key name, ...
    priority: int = 0  # lower first, as vLLM's; chat turns 0, API calls 1 by default
    grammar: object = None  # a fresh matcher compiled off the step loop (LLM.submit), or None
    # the front checked prompt_ids against this engine (LLM.encode_prompt): add_request trusts it
    # rather than walk the prompt a second time on the engine thread
    validated: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)
