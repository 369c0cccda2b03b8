"""RequestStream: the deltas of one request, handed from the engine thread to any caller.

Why its own file: it is the one hand-over point between the engine thread and the callers'
threads or event loops. The engine thread calls `_put`; a caller iterates (blocking, in a worker
thread) or uses `async for` (in an asyncio handler, without holding a thread); the switch from the
blocking queue to the event loop's is engine/front/handover.py's (no delta lost or reordered).
"""

from __future__ import annotations

from typing import Protocol

from engine.front.handover import Handover
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling.sampling_params import SamplingParams
from engine.core.sequence import RequestOutputDelta


class Aborts(Protocol):
    """All a stream needs of whoever made it: a way to abort its request (the LLM front)."""

    def abort(self, request_id: str) -> None: ...


class RequestStream:
    """Deltas of one request, in order. Iterate (blocking) or `async for` (non-blocking)."""

    def __init__(self, request_id: str, prompt_ids: list[int], n: int, llm: Aborts):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.n = n
        self._llm = llm
        self._handover = Handover()  # engine/front/handover.py: blocking or async consumer
        self._open = n

    def _put(self, delta: RequestOutputDelta) -> None:
        # raises RuntimeError if the consumer's event loop is closed: the engine then aborts
        # this request (nobody is listening) and carries on with the others
        self._handover.put(delta)

    def _done(self, delta: RequestOutputDelta) -> bool:
        if delta.finished:
            self._open -= 1
        return self._open <= 0

    def __iter__(self):
        while self._open > 0:
            d = self._handover.get()
            self._done(d)
            yield d

    def __aiter__(self):
        return self._agen()

    async def _agen(self):
        while self._open > 0:
            d = await self._handover.aget()
            self._done(d)
            yield d

    def abort(self) -> None:
        self._llm.abort(self.request_id)


def collect(stream: RequestStream, params: SamplingParams) -> RequestOutput:
    """Wait for every delta of `stream` and assemble the finished RequestOutput (the batch API)."""
    outs = [CompletionOutput(index=i) for i in range(params.n)]
    prompt_lps = None
    for d in stream:
        o = outs[d.index]
        if d.prompt_logprobs is not None and prompt_lps is None:
            prompt_lps = d.prompt_logprobs
        o.text += d.text
        o.token_ids.extend(d.token_ids)
        if params.logprobs is not None:
            o.logprobs = (o.logprobs or []) + list(d.logprobs or [])
            o.cumulative_logprob = sum(t.logprob for t in o.logprobs)
        if d.finished:
            o.finish_reason, o.metrics = d.finish_reason, d.metrics
            if d.error:
                raise RuntimeError(d.error)
    return RequestOutput(stream.request_id, stream.prompt_ids, outs, prompt_lps)
