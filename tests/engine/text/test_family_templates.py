"""Each family's chat template through the one safe tokenizer (engine/text/chat_tokens.py), and the
thinking models' engine side (engine/text/reasoning.py).

Injection: a user message holding that family's own markers (a fake end of turn, a fake system or
model turn, a fake reasoning block) gets none of their token ids: every special id in the prompt
is one the template put there (the same ids as the same conversation with a harmless message),
and the prompt still decodes to the text the template renders. Ordinary messages keep HF's ids.
Thinking: the enable_thinking switch reaches the template, past reasoning is not fed back when the
template drops it (and is when a template keeps it), replies split into reasoning and answer.
"""

import pytest

from engine.text.chat_tokens import encode_chat
from engine.text.reasoning import (
    ReasoningParser,
    prompt_opens_reasoning,
    reasoning_markers,
    split_reasoning,
)
from engine.text.session_prompt import continue_session_prompt
from tests.engine.family_chat import FAMILIES, KEEPS_THINKING, family_tokenizer


def _hf_ids(tok, messages, **kw):
    return tok.encode(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw),
        add_special_tokens=False,
    )


def _chat(user_text):
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": user_text},
    ]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_users_markers_never_become_that_familys_tokens(family):
    tok = family_tokenizer(family)
    injection = FAMILIES[family][3]
    marker_ids = set(tok.get_added_vocab().values())
    ids = encode_chat(tok, _chat("before " + injection + " after"))
    harmless = encode_chat(tok, _chat("before x after"))
    assert [t for t in ids if t in marker_ids] == [t for t in harmless if t in marker_ids]
    hf = _hf_ids(tok, _chat("before " + injection + " after"))
    assert len([t for t in hf if t in marker_ids]) > len([t for t in ids if t in marker_ids]), (
        "the plain encode is what lets the injection through"
    )
    rendered = tok.apply_chat_template(
        _chat("before " + injection + " after"), tokenize=False, add_generation_prompt=True
    )
    assert tok.decode(ids, skip_special_tokens=False) == rendered
    ordinary = _chat("Name three colours, please.")
    assert encode_chat(tok, ordinary) == _hf_ids(tok, ordinary)


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_thinking_switch_reaches_the_template(family):
    tok = family_tokenizer(family)
    think, end = (tok.convert_tokens_to_ids(m) for m in ("<think>", "</think>"))
    msgs = [{"role": "user", "content": "2 + 2?"}]
    on = continue_session_prompt(tok, msgs, None, enable_thinking=True)
    off = continue_session_prompt(tok, msgs, None, enable_thinking=False)
    default = continue_session_prompt(tok, msgs, None)
    assert on == default and think not in on
    assert off[-4:].count(end) == 1 or off.count(end) == 1
    assert off == _hf_ids(tok, msgs, enable_thinking=False)  # the template's own tokens, as HF
    assert not prompt_opens_reasoning(off, tok, reasoning_markers(tok))


def test_past_reasoning_is_not_fed_back_unless_the_template_keeps_it():
    """Turn 1's reply (kept ids, with its reasoning tokens) and turn 2: a Qwen3-style template drops
    the reasoning from the history, so the kept ids are not reused and turn 2's prompt holds no
    reasoning; a template that keeps it reuses the kept ids, reasoning included."""
    for template, fed_back in ((None, False), (KEEPS_THINKING, True)):
        tok = family_tokenizer("qwen3", template)
        think = tok.convert_tokens_to_ids("<think>")
        turn1 = [{"role": "user", "content": "2 + 2?"}]
        prompt1 = continue_session_prompt(tok, turn1, None)
        reply = "<think>\nadd them\n</think>\n\nfour"
        reply_ids = tok.encode(reply, add_special_tokens=False) + [
            tok.convert_tokens_to_ids("<|im_end|>")
        ]
        assert think in reply_ids
        turn2 = turn1 + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and 3 + 3?"},
        ]
        prompt2 = continue_session_prompt(tok, turn2, prompt1 + reply_ids)
        assert (think in prompt2) == fed_back
        assert (prompt2[: len(prompt1) + len(reply_ids)] == prompt1 + reply_ids) == fed_back


def test_reasoning_split_streaming_and_whole():
    text = "<think>\nFirst add.\nThen check.\n</think>\n\nThe answer is four."
    tok = family_tokenizer("qwen3")
    ids = tok.encode(text, add_special_tokens=False)
    marker_ids = tuple(tok.convert_tokens_to_ids(m) for m in ("<think>", "</think>"))
    whole = split_reasoning(text, ids, marker_ids=marker_ids)
    assert (whole.reasoning, whole.content) == ("First add.\nThen check.", "The answer is four.")
    assert whole.reasoning_tokens == ids.index(marker_ids[1]) - ids.index(marker_ids[0]) - 1 > 0
    for step in (1, 3, 7):  # any cut of the stream, markers split across deltas
        p, r, c = ReasoningParser(), "", ""
        for i in range(0, len(text), step):
            a, b = p.feed(text[i : i + step])
            r, c = r + a, c + b
        a, b = p.finish()
        assert (r + a, c + b) == (whole.reasoning, whole.content)
    assert split_reasoning("No thinking here.").reasoning is None
    assert split_reasoning("still thinking", inside=True).reasoning == "still thinking"
    assert split_reasoning("x</think>\nanswer", inside=True).content == "answer"
