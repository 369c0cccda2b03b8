"""Greedy outputs must be token-identical to HF transformers' generate on the same model (fp32, CPU)."""

import pytest
import torch

from engine import SamplingParams

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a pirate. Answer like one."},
        {
            "role": "user",
            "content": "How do computers store memory? Explain paging in a few sentences.",
        },
    ],
    [{"role": "user", "content": "Écris une phrase sur la mer."}],
    [{"role": "user", "content": "用一句话介绍北京。"}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Give me three tips for writing clean Python code."},
    ],
]
LONG = [
    {
        "role": "user",
        "content": " ".join(
            f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(30)
        )
        + " Summarize the list.",
    }
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _ids(llm, chat):
    from engine.text.session_prompt import continue_session_prompt

    return continue_session_prompt(llm.get_tokenizer(), chat, None)


def test_one_forward_logits_match_hf(make_llm, hf_model):
    from engine.exec.models.llama import AttentionMetadata
    from engine.config import EngineConfig
    from engine.exec.loader import load_model
    from engine.exec.model_runner import ModelRunner

    loaded = load_model(None)  # the model alone, outside any engine
    model = ModelRunner(EngineConfig(num_blocks=64), loaded.config, loaded.weights).model
    ids = _ids(make_llm(num_blocks=8), CHATS[1])
    T, bs = len(ids), 16
    pool = torch.zeros(2, model.num_layers, 64, bs, model.num_kv_heads, model.head_dim)
    table = torch.randperm(64)[: (T + bs - 1) // bs]  # non-contiguous physical blocks
    slots = torch.tensor([int(table[p // bs]) * bs + p % bs for p in range(T)])
    meta = AttentionMetadata(
        slots,
        table.to(torch.int32)[None],
        torch.tensor([T], dtype=torch.int32),
        torch.tensor([0, T], dtype=torch.int32),
        T,
        "torch",
    )
    ours = model.forward(torch.tensor(ids), torch.arange(T), pool, meta, torch.arange(T))
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_greedy_alone_matches_hf(make_llm, hf_greedy):
    llm = make_llm()
    for chat in CHATS[:3]:
        out = llm.chat(chat, GREEDY)[0]
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 24, draft=out.outputs[0].token_ids
        )


MORE = [
    [{"role": "user", "content": c}]
    for c in (
        "Wie spät ist es in Tokio, wenn es in Berlin Mittag ist?",
        "def add(a, b):\n    # finish this function",
        "¿Qué es una ecuación cuadrática?",
        "List three colours of the rainbow.",
    )
]


def test_greedy_batched_with_prefix_hits_matches_hf(make_llm, hf_greedy):
    """Ten chats decode together, past the lean step's batch limit, so the loop runs them and its
    greedy steps screen the LM head (kernels/greedy_head.py): the tokens must still be HF's. The
    same batch with one request asking for logprobs is not screened: every logit is read, and the
    logprobs are the whole head's (the same numbers with the screen taken away)."""
    llm = make_llm()
    model = llm.engine.runner.model
    llm.chat(CHATS[1], GREEDY)  # warms the prefix cache with the system prompt
    computed = model.greedy_screen.computed
    outs = llm.chat(CHATS + [LONG] + MORE, GREEDY)
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 24, draft=out.outputs[0].token_ids
        )
    assert llm.stats()["prefix_cache_hits"] > 0
    assert model.greedy_screen.computed > computed  # the loop's steps went through the screen
    chats = CHATS + [LONG] + MORE
    params = [GREEDY] * (len(chats) - 1) + [
        SamplingParams(temperature=0, max_tokens=24, logprobs=3)
    ]
    computed = model.greedy_screen.computed
    got = llm.chat(chats, params)
    assert model.greedy_screen.computed == computed  # no step of that batch was screened
    screens = model.greedy_screen, model.lean.screen
    model.greedy_screen = model.lean.screen = None
    try:
        want = llm.chat(chats, params)
    finally:
        model.greedy_screen, model.lean.screen = screens
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
    lp_got, lp_want = got[-1].outputs[0].logprobs, want[-1].outputs[0].logprobs
    assert lp_got is not None and len(lp_got) == len(lp_want) == 24
    for a, b in zip(lp_got, lp_want):  # both runs hit the prefix cache alike: 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a.top, b.top)), (a, b)


def test_chunked_prefill_matches_hf(make_llm, hf_greedy):
    llm = make_llm(max_num_batched_tokens=16)  # every prompt is split into 16-token chunks
    outs = llm.chat([LONG, CHATS[1], CHATS[4]], GREEDY)
    for out in outs:
        assert len(out.prompt_token_ids) > 16
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 24, draft=out.outputs[0].token_ids
        )


@pytest.mark.slow
def test_preemption_keeps_greedy_output(make_llm, hf_greedy):
    llm = make_llm(num_blocks=20, max_num_seqs=8)  # 320 token slots for ~5 x 110 tokens of demand
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = llm.chat(CHATS, params)
    stats = llm.stats()
    assert stats["num_preemptions"] > 0, stats
    events = llm.snapshot()["preemption_events"]
    assert len(events) == stats["num_preemptions"]
    assert {e["request_id"] for e in events} <= {o.request_id for o in outs}
    assert all(e["tokens_lost"] > 0 for e in events)
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(
            out.prompt_token_ids, 64, stop_at_eos=False, draft=out.outputs[0].token_ids
        )
    assert stats["used_blocks"] == 0
    assert stats["peak_used_blocks"] <= 20
