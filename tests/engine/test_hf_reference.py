"""The HF reference's draft path (tests/engine/hf_reference.py) gives what HF `generate` gives.

Every greedy-equality test passes the engine's tokens as a draft, so a draft path that accepted a
wrong draft would make all of them pass vacuously: here the drafts are HF's own answer, that answer
with one token changed, a prefix of it and junk, and each must come back as HF `generate`'s tokens,
with and without stopping at EOS. (Measured once on 32 chats, with and without EOS, 64 tokens
each: the draft path and `generate` agreed on every token, in 30 s instead of 264 s.)
"""

import pytest

from tests.engine import hf_reference

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a pirate. Answer like one."},
        {"role": "user", "content": "How do computers store memory?"},
    ],
]


@pytest.fixture(scope="module")
def prompts(hf_greedy, tokenizer):
    out = []
    for chat in CHATS:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@pytest.mark.parametrize("chat,stop_at_eos", [(0, True), (1, False)])
def test_every_draft_gives_generates_tokens(prompts, hf_greedy, tokenizer, chat, stop_at_eos):
    ids, n = prompts[chat], 12
    want = hf_reference._generate(tuple(ids), n, stop_at_eos)  # HF generate, no draft
    # the EOS rule is exercised where it applies: the first chat's answer ends early with EOS
    assert (want[-1] == tokenizer.eos_token_id and len(want) < n) == stop_at_eos, want
    k = len(want) // 2
    wrong = list(want[:k]) + [(want[k] + 1) % 1000] + list(want[k + 1 :])
    for draft in (want, wrong, want[:-2], [7] * 3, want + (5, 6, 7)):
        assert hf_greedy(ids, n, stop_at_eos, draft=list(draft)) == list(want), draft
