"""One API call's engine requests: merged deltas, per-choice accumulation, usage, abort, SSE framing.

A /v1/completions call with several prompts is several engine requests; a call with n > 1 is one
request whose n sequences share the prompt's blocks. Either way the handler sees one stream of
(choice index, delta). Leaving early (client gone, error) aborts every request that is still
running, from a worker thread so the event loop never waits for an engine step.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from routes.openai.schemas import usage as usage_dict

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


@dataclass
class Choice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    prompt_logprobs: list | None = None  # echo: [None, TokenLogprob, ...] per prompt token


@dataclass
class Submitted:
    stream: object  # engine.front.llm.RequestStream
    prompt_len: int
    first_choice: int  # choice index of this request's sequence 0


def _abort_quietly(llm, request_id: str) -> None:
    try:
        llm.abort(request_id)
    except RuntimeError:  # engine already shut down: nothing left to free
        pass


class Generation:
    def __init__(self, llm, subs: list[Submitted], n: int):
        self.llm, self.subs, self.n = llm, subs, n
        self.choices = [Choice() for _ in range(len(subs) * n)]
        self.cached = [0] * len(subs)
        self._open = {s.stream.request_id for s in subs}
        self.disconnected = False

    @property
    def finished(self) -> bool:
        return not self._open

    def _note(self, k: int, d) -> int:
        """Record one delta of request k; returns its choice index."""
        i = self.subs[k].first_choice + d.index
        c = self.choices[i]
        c.text += d.text
        c.token_ids.extend(d.token_ids)
        lp = d.logprobs
        if lp:
            c.logprobs.extend(lp)
        if d.prompt_logprobs is not None:
            c.prompt_logprobs = d.prompt_logprobs
        if d.index == 0 and "cached_tokens" in (d.metrics or {}):
            self.cached[k] = d.metrics["cached_tokens"]
        if d.finished:
            c.finish_reason, c.error = d.finish_reason, d.error
        return i

    async def deltas(self):
        """Yield (choice index, delta) as the engine produces them, over every request."""
        if len(self.subs) == 1:
            async for d in self.subs[0].stream:
                yield self._note(0, d), d
            self._open.clear()
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(k, stream):
            try:
                async for d in stream:
                    q.put_nowait((k, d))
            finally:
                q.put_nowait((k, None))

        tasks = [asyncio.create_task(pump(k, s.stream)) for k, s in enumerate(self.subs)]
        try:
            left = len(tasks)
            while left:
                k, d = await q.get()
                if d is None:
                    left -= 1
                    self._open.discard(self.subs[k].stream.request_id)
                    continue
                yield self._note(k, d), d
        finally:
            for t in tasks:
                t.cancel()

    async def collect(self) -> None:
        async for _ in self.deltas():
            pass

    def abort(self) -> None:
        """Abort whatever has not finished; never blocks the event loop."""
        if self.finished:
            return
        loop = asyncio.get_running_loop()
        for s in self.subs:
            loop.run_in_executor(None, _abort_quietly, self.llm, s.stream.request_id)

    def error(self) -> str | None:
        return next((c.error for c in self.choices if c.error), None)

    def usage(self) -> dict:
        return usage_dict(
            sum(s.prompt_len for s in self.subs),
            sum(len(c.token_ids) for c in self.choices),
            sum(self.cached),
        )


async def watch_disconnect(request, gen: Generation) -> None:
    """For non-streaming calls: a client that hangs up aborts its requests (frees their blocks)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            gen.disconnected = True
            gen.abort()
            return
