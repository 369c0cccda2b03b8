"""/v1/completions `echo` + `logprobs`, what lm-evaluation-harness's log-likelihood tasks send:
the prompt's token logprobs equal HF's log_softmax (fp32) within 1e-4, with max_tokens 0 or 1,
also when the prompt's prefix is already in the prefix cache (those positions are recomputed)."""

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPT = (
    "Question: What is the boiling point of water at sea level in degrees Celsius? "
    "Answer: The boiling point of water at sea level is 100 degrees Celsius."
)


def _hf(hf_model, ids):
    with torch.no_grad():
        lp = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [float(lp[p, ids[p + 1]]) for p in range(len(ids) - 1)], lp


def test_echo_prompt_logprobs_equal_hf_with_and_without_a_cached_prefix(
    client, model_id, llm, hf_model
):
    ids = llm.get_tokenizer().encode(PROMPT)
    ref, lp = _hf(hf_model, ids)
    # put the prompt in the cache first, and check it really is
    client.completions.create(model=model_id, prompt=PROMPT, max_tokens=1, temperature=0)
    warm = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=1, temperature=0)
    assert warm.usage.prompt_tokens_details.cached_tokens >= 16
    for max_tokens in (0, 1):
        r = client.completions.create(
            model=model_id,
            prompt=PROMPT,
            max_tokens=max_tokens,
            temperature=0,
            echo=True,
            logprobs=2,
        )
        c = r.choices[0]
        got = c.logprobs.token_logprobs
        assert got[0] is None and c.logprobs.top_logprobs[0] is None
        n = len(ids)
        assert len(got) == n + max_tokens
        assert max(abs(g - h) for g, h in zip(got[1:n], ref)) < 1e-4
        assert "".join(c.logprobs.tokens[:n]) == PROMPT
        assert c.text.startswith(PROMPT) and (max_tokens or c.text == PROMPT)
        for p in range(1, n):  # alternatives: HF's top-2 at that position
            top = c.logprobs.top_logprobs[p]
            assert len(top) == 2 and max(top.values()) == pytest.approx(
                float(lp[p - 1].max()), abs=1e-4
            )
        assert c.logprobs.text_offset[:3] == [
            0,
            len(c.logprobs.tokens[0]),
            len(c.logprobs.tokens[0]) + len(c.logprobs.tokens[1]),
        ]


def test_echo_of_token_prompts_and_several_prompts(client, model_id, llm, hf_model):
    tok = llm.get_tokenizer()
    prompts = [
        tok.encode("One, two, three, four"),
        tok.encode("The sky is blue and the grass is green"),
    ]
    r = client.completions.create(
        model=model_id, prompt=prompts, max_tokens=0, echo=True, logprobs=0
    )
    assert len(r.choices) == 2
    for ids, c in zip(prompts, sorted(r.choices, key=lambda c: c.index)):
        ref, _ = _hf(hf_model, ids)
        got = c.logprobs.token_logprobs
        assert len(got) == len(ids) and max(abs(g - h) for g, h in zip(got[1:], ref)) < 1e-4
        assert c.text == tok.decode(ids)
