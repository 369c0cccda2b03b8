"""Beam search's front half (any thread): validate and encode the prompts, count them against the
tenant's queue bounds, and admit every search in one engine command; a handle per search.

Why on the front floor: submitting drives the LLM (encode, admission, `run_on_engine`); the search
itself (engine/core/beam_search.py) runs on the engine thread and never sees the front.
"""

from __future__ import annotations

import asyncio

from engine.core.beam_search import BeamGroup, BeamSearchOutput, BeamSearchParams, add_beam_request
from engine.core.sequence import Request
from engine.core.tenancy import LOCAL_TENANT
from engine.sampling.sampling_params import SamplingParams


class BeamSearchHandle:
    """A submitted search: `result()` blocks, `await handle` suits asyncio, `abort()` stops it."""

    def __init__(self, llm, group: BeamGroup):
        self._llm, self._group = llm, group
        self.request_id = group.req.request_id
        self.prompt_token_ids = list(group.req.prompt_ids)
        self.future = group.future

    def result(self, timeout: float | None = None) -> BeamSearchOutput:
        return self.future.result(timeout)

    def abort(self) -> bool:
        return self._llm.abort(self.request_id)

    def __await__(self):
        return asyncio.wrap_future(self.future).__await__()


def submit_beam_searches(
    llm,
    prompts: list,
    params: BeamSearchParams,
    on_step=None,
    request_ids: list | None = None,
    cache_salt=None,
    tenant: str | None = None,
    priority: int = 0,
) -> list[BeamSearchHandle]:
    """Encode (raising ValueError on bad input before anything is queued), then admit all in one
    engine command so they share the next step. cache_salt: every search's prefix-cache salt
    (engine/kv/salt_rule.py; a search must not skip the user's salt, #29.2). tenant / priority:
    as for LLM.submit: the fair scheduler serves the search as that user's, and it counts against
    that user's queue bounds (engine/core/admission.py) until its first step: QueueFull, with
    nothing queued, when a bound would be passed."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError("params must be a BeamSearchParams")
    encoded = [llm.encode_prompt(p) for p in prompts]
    info = llm.model_info()
    handles = []
    for j, ids in enumerate(encoded):
        rid = (request_ids[j] if request_ids else None) or llm.new_request_id("beam")
        max_new = max(1, min(params.max_tokens, info.max_model_len - len(ids)))
        # n = k so that the scheduler reserves k of max_num_seqs at admission (the group forks into
        # k beams after the prompt); the group's rows never reach the engine's own n > 1 fork
        req = Request(
            rid,
            ids,
            SamplingParams(n=params.beam_width, temperature=0, max_tokens=max_new, ignore_eos=True),
            cache_salt=cache_salt,
            tenant=str(tenant) if tenant else LOCAL_TENANT,
            priority=int(priority),
            validated=True,
        )  # by encode_prompt above
        group = BeamGroup(
            req,
            params,
            set(info.eos_token_ids),
            max_new,
            llm.get_tokenizer(),
            info.block_size,
            on_step,
        )
        handles.append(BeamSearchHandle(llm, group))
    entered = []
    try:
        for h in handles:
            llm.admission.enter(h.request_id, h._group.req.tenant, len(h.prompt_token_ids))
            entered.append(h.request_id)
    except Exception:
        for rid in entered:
            llm.admission.leave(rid)
        raise
    for h in handles:
        leave = (lambda rid: lambda *_: llm.admission.leave(rid))(h.request_id)
        h._group.on_started = leave
        h.future.add_done_callback(leave)  # ended before its first step (aborted, refused)
    groups = [h._group for h in handles]

    def admit(e) -> None:
        for g in groups:
            add_beam_request(e, g)

    llm.run_on_engine(admit)
    return handles
