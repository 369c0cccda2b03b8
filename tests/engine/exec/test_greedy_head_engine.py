"""Greedy steps through the screened LM head (kernels/greedy_head.py) in the engine, real model.

Ten greedy chats decode together, past the lean step's batch limit, so the loop's bf16 screen
runs; their tokens must be HF's. A step that holds one request asking for logprobs must read
every logit: its logprobs are the whole head's (the same numbers with the screen taken away)."""

import pytest

from engine import SamplingParams

CHATS = [
    [{"role": "user", "content": c}]
    for c in (
        "Name two rivers in Africa.",
        "Wie spät ist es in Tokio, wenn es in Berlin Mittag ist?",
        "Write a haiku about rain on a tin roof.",
        "¿Qué es una ecuación cuadrática?",
        "def add(a, b):\n    # finish this function",
        "Give one reason to learn a second language.",
        "Quelle est la différence entre un lac et un étang ?",
        "Explain what a hash map is in one sentence.",
        "如何煮米饭？",
        "List three colours of the rainbow.",
    )
]
GREEDY = SamplingParams(temperature=0, max_tokens=20)


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(num_blocks=256)


def test_a_greedy_batch_on_the_loop_is_screened_and_matches_hf(llm, hf_greedy):
    screen = llm.engine.runner.model.greedy_screen
    assert screen is not None, llm.engine.runner.model.cpu_path
    before = screen.computed
    outs = llm.chat(CHATS, GREEDY)
    assert screen.computed > before  # the loop's steps went through the screen
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 20, draft=out.outputs[0].token_ids
        )


def test_a_step_with_a_logprobs_request_reads_every_logit(llm):
    model = llm.engine.runner.model
    params = [GREEDY] * 9 + [SamplingParams(temperature=0, max_tokens=20, logprobs=3)]
    before = model.greedy_screen.computed
    got = llm.chat(CHATS, params)
    assert model.greedy_screen.computed == before  # no step of that batch was screened
    model.greedy_screen, lean_screen = None, model.lean.screen
    model.lean.screen = None
    try:
        want = llm.chat(CHATS, params)
    finally:
        model.lean.screen = lean_screen
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
    lp_got, lp_want = got[-1].outputs[0].logprobs, want[-1].outputs[0].logprobs
    assert lp_got is not None and len(lp_got) == len(lp_want) == 20
    # the second run hits the prefix cache (its prefill rounds a little differently): 1e-4
    for a, b in zip(lp_got, lp_want):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a.top, b.top)), (a, b)
