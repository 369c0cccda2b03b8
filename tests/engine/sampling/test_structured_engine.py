"""Constrained decoding through the real engine and model: outputs validate (jsonschema, re), n > 1
forks each follow their own matcher, preemption and recompute leave a constrained reply exactly as
it was, stop strings and logprobs still work, bad grammars fail that request only, and the
grammar is compiled once per schema. Prompt logprobs equal HF's log_softmax (fp32), also when the
prompt's prefix is already in the cache."""

import json
import re

import jsonschema
import pytest
import torch

from engine import SamplingParams
from engine.sampling.structured import StructuredSpec

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
}
ASK = [{"role": "user", "content": "Describe a user of a website as JSON."}]


def _chat(llm, params, messages=ASK):
    return llm.chat([messages], params)[0]


def test_json_schema_greedy_sampled_and_n3_all_validate(make_llm):
    llm = make_llm(num_blocks=256, max_num_seqs=8)
    spec = StructuredSpec("json_schema", PERSON)
    for params in (
        SamplingParams(temperature=0, max_tokens=120, structured=spec),
        SamplingParams(temperature=1.0, top_p=0.95, n=3, seed=5, max_tokens=120, structured=spec),
    ):
        out = _chat(llm, params)
        texts = [o.text for o in out.outputs]
        for o in out.outputs:
            assert o.finish_reason == "stop", o
            jsonschema.validate(json.loads(o.text), PERSON)
    assert len(set(texts)) > 1, "three seeded forks drew the same reply: they share one matcher?"
    assert llm.engine.grammars.compiles == 1 and llm.engine.grammars.hits >= 1  # compiled once


def test_regex_choice_and_json_object(make_llm):
    llm = make_llm(num_blocks=128)
    o = _chat(
        llm,
        SamplingParams(
            temperature=0.8,
            seed=2,
            max_tokens=20,
            structured=StructuredSpec("regex", r"[A-Z][a-z]{2,8}-\d{3}"),
        ),
        [{"role": "user", "content": "Invent a product code."}],
    ).outputs[0]
    assert re.fullmatch(r"[A-Z][a-z]{2,8}-\d{3}", o.text) and o.finish_reason == "stop"
    out = _chat(
        llm,
        SamplingParams(
            temperature=1.0,
            n=4,
            seed=3,
            max_tokens=10,
            structured=StructuredSpec("choice", ["yes", "no", "maybe later"]),
        ),
        [{"role": "user", "content": "Is the sky green?"}],
    )
    assert all(o.text in ("yes", "no", "maybe later") for o in out.outputs)
    o = _chat(
        llm,
        SamplingParams(temperature=0, max_tokens=80, structured=StructuredSpec("json_object")),
        [{"role": "user", "content": 'Reply with the JSON {"ok": true}'}],
    ).outputs[0]
    assert o.text.startswith("{")
    if o.finish_reason == "stop":  # a small model may run out of tokens inside the object
        assert isinstance(json.loads(o.text), dict)


def test_grammar_lark_and_logprobs_and_stop_strings(make_llm):
    llm = make_llm(num_blocks=128)
    g = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/'
    o = _chat(
        llm,
        SamplingParams(
            temperature=0, max_tokens=20, logprobs=2, structured=StructuredSpec("grammar", g)
        ),
        [{"role": "user", "content": "What is 6 times 7?"}],
    ).outputs[0]
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", o.text)
    assert len(o.logprobs) == len(o.token_ids) and all(len(t.top) == 2 for t in o.logprobs)
    # a stop string inside the constrained text still ends the reply there
    o = _chat(
        llm,
        SamplingParams(
            temperature=0, max_tokens=20, stop=[" is"], structured=StructuredSpec("grammar", g)
        ),
        [{"role": "user", "content": "What is 6 times 7?"}],
    ).outputs[0]
    assert o.text == "The answer" and o.finish_reason == "stop"


def test_a_bad_grammar_fails_its_request_only(make_llm):
    llm = make_llm(num_blocks=128)
    ok = llm.submit("Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    with pytest.raises(ValueError, match="not valid"):
        llm.submit("Hi", SamplingParams(structured=StructuredSpec("regex", "([a-z")))
    with pytest.raises(ValueError, match="not valid"):
        llm.submit(
            "Hi", SamplingParams(structured=StructuredSpec("json_schema", {"type": "bogus"}))
        )
    assert sum(len(d.token_ids) for d in ok) == 8


def test_preemption_recompute_keeps_a_constrained_reply_identical(make_llm):
    """Same seeded constrained requests in a roomy pool and in one so small that they preempt each
    other: the matcher follows the kept tokens, so every reply is the same, and valid."""
    spec = StructuredSpec("json_schema", PERSON)
    prompts = [
        [{"role": "user", "content": f"Describe user number {i} as JSON."}] for i in range(3)
    ]
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=70, structured=spec)
    roomy = make_llm(num_blocks=128, max_model_len=128, max_num_seqs=3)
    ref = [o.outputs[0].token_ids for o in roomy.chat(prompts, params)]
    tight = make_llm(num_blocks=8, max_model_len=128, max_num_seqs=3)
    got = tight.chat(prompts, params)
    assert tight.snapshot()["preemption_events"], "the small pool was meant to preempt"
    assert [o.outputs[0].token_ids for o in got] == ref
    for o in got:
        if o.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(o.outputs[0].text), PERSON)


def test_lazy_trigger_leaves_text_before_it_free(make_llm):
    """The trigger is a piece of the model's own greedy reply: up to it the constrained reply is
    the free one token for token; after it, only the grammar's text."""
    llm = make_llm(num_blocks=128)
    msgs = [{"role": "user", "content": "Name three fruits."}]
    free = _chat(llm, SamplingParams(temperature=0, max_tokens=12), msgs).outputs[0]
    tok = llm.get_tokenizer()
    head = tok.decode(free.token_ids[:4])
    trigger = head[-6:]
    assert trigger.strip() and head.index(trigger) == len(head) - len(
        trigger
    )  # first seen at token 4
    spec = StructuredSpec("grammar", 'start: " ZZZ."', trigger=trigger)
    o = _chat(llm, SamplingParams(temperature=0, max_tokens=30, structured=spec), msgs).outputs[0]
    assert o.token_ids[:4] == free.token_ids[:4]
    assert o.text == head + " ZZZ." and o.finish_reason == "stop"


def test_logit_bias_through_the_engine(make_llm):
    llm = make_llm(num_blocks=64)
    tok = llm.get_tokenizer().encode(" banana", add_special_tokens=False)[0]
    o = llm.generate(
        ["My favourite fruit is"],
        SamplingParams(temperature=0, max_tokens=3, logit_bias={tok: 100.0}),
    )[0].outputs[0]
    assert o.token_ids == [tok] * 3
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.submit("x", SamplingParams(logit_bias={10**7: 1.0}))


def _hf_prompt_logprobs(hf_model, ids):
    with torch.no_grad():
        lp = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [float(lp[p, ids[p + 1]]) for p in range(len(ids) - 1)]


def test_prompt_logprobs_equal_hf_also_with_a_cached_prefix(make_llm, hf_model):
    llm = make_llm(num_blocks=128, max_num_batched_tokens=24)  # several prefill chunks
    tok = llm.get_tokenizer()
    text = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."
    ids = tok.encode(text)
    ref = _hf_prompt_logprobs(hf_model, ids)
    llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=2)
    )  # now cached
    assert llm.engine.kv.lookup_prefix(ids) >= 16
    for _ in range(2):
        out = llm.generate(
            [{"prompt_token_ids": ids}],
            SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3),
        )[0]
        got = out.prompt_logprobs
        assert got[0] is None and len(got) == len(ids)
        assert [t.token_id for t in got[1:]] == ids[1:]
        assert max(abs(t.logprob - r) for t, r in zip(got[1:], ref)) < 1e-4
        assert all(len(t.top) == 3 and t.top[0][1] >= t.logprob - 1e-6 for t in got[1:])
