"""Logprobs out of the engine: the real model, compared with log_softmax of HF's logits."""

import torch

from engine import SamplingParams


def test_greedy_logprobs_equal_hf_log_softmax(make_llm, hf_model):
    llm = make_llm(num_blocks=64)
    chat = [{"role": "user", "content": "Name three colours."}]
    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8, logprobs=4, ignore_eos=True))[
        0
    ]
    comp = out.outputs[0]
    assert len(comp.logprobs) == len(comp.token_ids) == 8
    ids = out.prompt_token_ids + comp.token_ids
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    P = len(out.prompt_token_ids)
    for j, (tok, lp) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref[P - 1 + j]
        assert lp.token_id == tok == int(row.argmax())
        assert abs(lp.logprob - float(row[tok])) < 1e-4
        assert [t for t, _ in lp.top] == row.topk(4).indices.tolist()
        assert max(abs(v - float(row[t])) for t, v in lp.top) < 1e-4
    assert (
        abs(
            comp.cumulative_logprob
            - sum(float(ref[P - 1 + j, t]) for j, t in enumerate(comp.token_ids))
        )
        < 1e-3
    )


def test_no_logprobs_unless_asked(make_llm):
    llm = make_llm(num_blocks=64)
    comp = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.7, max_tokens=3))[0].outputs[0]
    assert comp.logprobs is None and comp.cumulative_logprob is None
