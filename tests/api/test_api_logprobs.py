"""logprobs / top_logprobs through the API, against the engine's logprobs contract
(SamplingParams.logprobs; RequestOutputDelta.logprobs = [TokenLogprob(token_id, logprob, top)]).

Until the engine has SamplingParams.logprobs the API must refuse logprobs with a clear 400; once it
has the field, the same tests check the values against HF's log_softmax of the same positions. The
switch is the field itself (ENGINE_HAS_LOGPROBS), so nothing needs editing when the engine lands it.
"""

from __future__ import annotations

import dataclasses

import openai
import pytest

from engine import SamplingParams

ENGINE_HAS_LOGPROBS = "logprobs" in {f.name for f in dataclasses.fields(SamplingParams)}
MSG = [{"role": "user", "content": "Name a fruit."}]


def test_chat_logprobs(client, model_id, llm, request):
    call = dict(
        model=model_id, messages=MSG, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    if not ENGINE_HAS_LOGPROBS:
        with pytest.raises(openai.BadRequestError, match="logprobs are not supported"):
            client.chat.completions.create(**call)
        return
    import torch

    r = client.chat.completions.create(**call)
    content = r.choices[0].logprobs.content
    ref = llm.chat(MSG, SamplingParams(temperature=0.0, max_tokens=6))[0]
    assert len(content) == len(ref.outputs[0].token_ids)
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert abs(entry.logprob - tops[0]) < 1e-5  # greedy picks the most likely token
    hf = request.getfixturevalue("hf_model")
    ids = torch.tensor([ref.prompt_token_ids + ref.outputs[0].token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    p = len(ref.prompt_token_ids)
    for k, (tok, entry) in enumerate(zip(ref.outputs[0].token_ids, content)):
        assert abs(entry.logprob - logp[p - 1 + k, tok].item()) < 1e-3


def test_streamed_and_completion_logprobs(client, model_id):
    if not ENGINE_HAS_LOGPROBS:
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            client.completions.create(model=model_id, prompt="Hello", max_tokens=3, logprobs=2)
        return
    r = client.completions.create(
        model=model_id, prompt="Hello", max_tokens=3, logprobs=2, temperature=0
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    chunks = list(
        client.chat.completions.create(
            model=model_id, messages=MSG, max_tokens=4, stream=True, logprobs=True, temperature=0
        )
    )
    entries = [
        e
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert entries and all(e.top_logprobs == [] for e in entries)


def test_top_logprobs_out_of_range_is_400(client, model_id):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=MSG, logprobs=True, top_logprobs=21)


def test_formatter_builds_both_openai_shapes_from_contract_records(tokenizer):
    """Runs today: the contract's records (token_id, logprob, top) -> chat and completions shapes."""
    from dataclasses import dataclass

    from routes.openai.params import LogprobFormatter

    @dataclass(frozen=True)
    class TokenLogprob:  # the contract's shape (engine/outputs.py once merged)
        token_id: int
        logprob: float
        top: tuple = ()

    ids = tokenizer.encode(" Hello world", add_special_tokens=False)
    recs = [
        TokenLogprob(ids[0], -0.5, ((ids[0], -0.5), (ids[1], -1.5))),
        TokenLogprob(ids[1], -0.25),
    ]
    fmt = LogprobFormatter(tokenizer)
    chat = fmt.chat(recs)["content"]
    assert "".join(e["token"] for e in chat) == " Hello world"
    assert chat[0]["top_logprobs"][1] == {
        "token": " world",
        "logprob": -1.5,
        "bytes": list(b" world"),
    }
    assert chat[1]["top_logprobs"] == [] and chat[1]["logprob"] == -0.25
    comp = fmt.completion(recs, text_offset=10)
    assert comp["tokens"] == [" Hello", " world"] and comp["token_logprobs"] == [-0.5, -0.25]
    assert comp["top_logprobs"][0] == {" Hello": -0.5, " world": -1.5} and comp["text_offset"] == [
        10,
        16,
    ]
    assert fmt.chat(None) is None and fmt.completion(None) is None
