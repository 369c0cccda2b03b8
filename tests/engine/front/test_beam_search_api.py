"""LLM.beam_search / submit_beam_search as a caller sees them: validation, per-request errors,
abort, a failing viewer, asyncio, sharing the engine with ordinary requests, preemption of beams.
Every engine here is checked for leaked blocks when the module ends (make_llm)."""

import asyncio
import threading

import pytest

from engine import SamplingParams
from engine import BeamSearchParams
from engine.text.session_prompt import continue_session_prompt

CHAT = [{"role": "user", "content": "Give me three tips for writing clean Python code."}]


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(num_blocks=256)


def _ids(llm, chat=CHAT):
    return continue_session_prompt(llm.get_tokenizer(), chat, None)


@pytest.mark.parametrize(
    "kw",
    [
        dict(beam_width=0, max_tokens=4),
        dict(beam_width=2, max_tokens=0),
        dict(beam_width=2.5, max_tokens=4),
        dict(beam_width=2, max_tokens=4, temperature=-1),
        dict(beam_width=2, max_tokens=4, early_stopping="sometimes"),
    ],
)
def test_bad_params_are_rejected(kw):
    with pytest.raises(ValueError, match="BeamSearchParams"):
        BeamSearchParams(**kw)


def test_bad_prompt_fails_before_anything_runs(llm):
    good = {"prompt_token_ids": _ids(llm)}
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.beam_search([good, [1, 2, 10**9]], BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        llm.submit_beam_search("", BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(good, SamplingParams())
    assert llm.stats()["used_blocks"] == 0 and llm.stats()["num_sequences"] == 0


def test_width_one_with_early_stopping_is_greedy(llm):
    ids = _ids(llm)
    greedy = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=20))[
        0
    ]
    beam = llm.beam_search(
        {"prompt_token_ids": ids},
        BeamSearchParams(beam_width=1, max_tokens=20, early_stopping=True),
    )[0]
    got = list(beam.sequences[0].token_ids)
    if beam.sequences[0].finish_reason == "stop":
        got = got[:-1]  # generate() does not return the EOS id it stopped at
    assert got == greedy.outputs[0].token_ids


def test_abort_mid_search_frees_everything(llm):
    started = threading.Event()
    handle = llm.submit_beam_search(
        {"prompt_token_ids": _ids(llm)},
        BeamSearchParams(beam_width=4, max_tokens=200, ignore_eos=True),
        on_step=lambda ev: ev.step >= 3 and started.set(),
    )
    assert started.wait(300)
    assert handle.abort()
    with pytest.raises(RuntimeError, match="abort"):
        handle.result(timeout=60)
    s = llm.stats()
    assert s["used_blocks"] == 0 and s["num_sequences"] == 0 and s["running"] == 0


def test_failing_viewer_ends_its_search_only(llm):
    ids = _ids(llm)
    solo = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=24))[0]

    def boom(ev):
        if ev.step == 2:
            raise KeyError("viewer bug")

    handle = llm.submit_beam_search(
        {"prompt_token_ids": ids},
        BeamSearchParams(beam_width=3, max_tokens=30, ignore_eos=True),
        on_step=boom,
    )
    other = llm.submit_beam_search(
        {"prompt_token_ids": ids}, BeamSearchParams(beam_width=2, max_tokens=8)
    )
    together = llm.generate(
        {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=24)
    )[0]
    with pytest.raises(RuntimeError, match="viewer bug"):
        handle.result(timeout=300)
    assert len(other.result(timeout=300).sequences) == 2
    assert together.outputs[0].token_ids == solo.outputs[0].token_ids
    assert llm.stats()["used_blocks"] == 0


def test_awaitable_from_asyncio(llm):
    async def main():
        h = llm.submit_beam_search(
            {"prompt_token_ids": _ids(llm)}, BeamSearchParams(beam_width=2, max_tokens=6)
        )
        return await h

    out = asyncio.run(main())
    assert len(out.sequences) == 2 and all(s.text for s in out.sequences)


def test_preempted_beams_are_recomputed_and_give_the_same_result(make_llm, llm):
    """A pool too small for 4 diverging beams: the scheduler preempts beams (recompute), their
    siblings wait for them, and the search still returns what an unconstrained engine returns."""
    ids = _ids(llm)
    params = BeamSearchParams(beam_width=4, max_tokens=40, ignore_eos=True)
    ref = llm.beam_search({"prompt_token_ids": ids}, params)[0]
    small = make_llm(num_blocks=9, block_size=16)
    out = small.beam_search({"prompt_token_ids": ids}, params)[0]
    st = small.stats()
    print(
        f"\npreemptions={st['num_preemptions']} beam stats={out.stats} peak_used_blocks={st['peak_used_blocks']}"
    )
    assert st["num_preemptions"] > 0 and out.stats["stalls"] > 0, (st, out.stats)
    assert [s.token_ids for s in out.sequences] == [s.token_ids for s in ref.sequences]
    assert [s.score for s in out.sequences] == pytest.approx(
        [s.score for s in ref.sequences], abs=1e-4
    )
    assert st["used_blocks"] == 0


def test_failed_step_fails_the_search_without_leaks_or_stale_cache(llm):
    """Fault injection: a forward with the beams raises; the search ends with that error, its
    blocks come back, and a rerun gives the same result as before (no stale prefix-cache hits)."""
    ids = _ids(llm)
    params = BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True)
    ref = llm.beam_search({"prompt_token_ids": ids}, params)[0]
    from engine.exec.model_runner import ModelRunner

    real_run = ModelRunner.run_on_device
    calls = {"n": 0}

    def flaky(self, plan):  # patched on the class: no reach into the LLM
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected failure")
        return real_run(self, plan)

    ModelRunner.run_on_device = flaky
    try:
        with pytest.raises(RuntimeError, match="injected"):
            llm.submit_beam_search({"prompt_token_ids": ids}, params).result(timeout=300)
    finally:
        ModelRunner.run_on_device = real_run
    s = llm.stats()
    assert s["used_blocks"] == 0 and s["running"] == 0 and s["waiting"] == 0
    again = llm.beam_search({"prompt_token_ids": ids}, params)[0]
    assert [x.token_ids for x in again.sequences] == [x.token_ids for x in ref.sequences]


def test_shutdown_ends_a_search_in_flight():
    from engine import ServingLLM

    llm = ServingLLM(num_blocks=64)
    started = threading.Event()
    h = llm.submit_beam_search(
        _ids(llm),
        BeamSearchParams(beam_width=2, max_tokens=300, ignore_eos=True),
        on_step=lambda ev: started.set(),
    )
    assert started.wait(300)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        h.result(timeout=60)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.submit_beam_search(_ids(llm), BeamSearchParams(beam_width=2, max_tokens=3))


def test_a_search_reserves_its_width_of_max_num_seqs(make_llm):
    """Admitted as one prompt, a width-4 search becomes 4 running beams: it must count as 4 from
    the start, so a request submitted with it waits instead of pushing running past the cap."""
    small = make_llm(num_blocks=256, max_num_seqs=4)
    ids = _ids(small)
    other = small.submit(
        {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    )
    h = small.submit_beam_search(
        {"prompt_token_ids": ids}, BeamSearchParams(beam_width=4, max_tokens=6)
    )
    assert sum(len(d.token_ids) for d in other) == 48
    assert len(h.result(timeout=300).sequences) == 4
    assert small.stats()["peak_running"] == 4


def test_a_search_is_its_tenants_and_counts_against_its_queue_bound(make_llm):
    """A beam search is scheduled as its submitter's (tenant, priority) and waits in that tenant's
    admission count like any request: over --tenant-max-queued-requests it is refused (QueueFull,
    nothing queued), and once it ran the count is free again."""
    from engine.core.admission import QueueBounds, QueueFull

    llm = make_llm(
        num_blocks=256, max_num_seqs=1, queue_bounds=QueueBounds(tenant_max_queued_requests=1)
    )
    busy = llm.submit(
        {"prompt_token_ids": _ids(llm)},
        SamplingParams(max_tokens=400, ignore_eos=True),
        tenant="carol",
    )
    next(iter(busy))  # carol holds the only slot: searches wait
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    first = llm.submit_beam_search(
        {"prompt_token_ids": _ids(llm)}, params, tenant="alice", priority=2
    )
    assert first._group.req.tenant == "alice" and first._group.req.priority == 2
    with pytest.raises(QueueFull):
        llm.submit_beam_search({"prompt_token_ids": _ids(llm)}, params, tenant="alice")
    with pytest.raises(QueueFull):  # ordinary requests share the same count
        llm.submit({"prompt_token_ids": _ids(llm)}, SamplingParams(max_tokens=2), tenant="alice")
    other = llm.submit_beam_search(
        {"prompt_token_ids": _ids(llm)}, params, tenant="bob"
    )  # bob's own bound
    assert llm.abort(busy.request_id)
    assert (
        len(first.result(timeout=300).sequences) == 2
        and len(other.result(timeout=300).sequences) == 2
    )
    again = llm.submit_beam_search({"prompt_token_ids": _ids(llm)}, params, tenant="alice")
    assert len(again.result(timeout=300).sequences) == 2
