"""A thinking model's reply in the chat (ui/chat/thinking.py and its uses in the view, the context
meter, the Memory tab's block table and the model picker): pure functions, checked directly."""

from ui.chat import context_meter, model_picker, thinking, view
from ui.dashboard import panels

REPLY = "<think>\nLet me see: <img src=x onerror=alert(1)> and </details><script>x</script>\n</think>\n\nIt is **42**."


def _stored(content=REPLY, tokens=17, ids=None):
    return {
        "id": 2,
        "role": "assistant",
        "content": content,
        "status": "complete",
        "token_ids": ids if ids is not None else [300] + list(range(3, 3 + tokens)) + [301, 50, 2],
        "stats": {"output_tokens": 20, "reasoning_tokens": tokens, "finish_reason": "stop"},
    }


def test_a_stored_reply_folds_its_reasoning_above_the_answer_and_nothing_it_wrote_is_markup():
    shown, _ = view.display_messages(
        [{"id": 1, "role": "user", "content": "q"}, _stored()], eos_ids={2}
    )
    parts = shown[1]["content"]
    fold, answer, footer = (p["text"] for p in parts)
    assert fold.startswith('<details class="reasoning"><summary>Thought for 17 tokens</summary>')
    assert " open" not in fold.split(">")[0]  # folded
    assert "&lt;img" in fold and "<img" not in fold and "<script" not in fold
    assert fold.count("</details>") == 1 and fold.endswith("</details>")  # the model's own is text
    assert answer == "It is **42**." and "think>" not in answer
    # Copy gives the answer's Markdown only, and the stats line is outside both
    assert view.SOURCE_CLASS in footer and "reply-stats" in footer
    import base64

    src = footer.split('title="')[1].split('"')[0]
    assert base64.b64decode(src).decode() == "It is **42**."


def test_a_reply_without_a_reasoning_block_or_from_a_model_that_does_not_think_is_unchanged():
    assert thinking.stored_split("plain", {"output_tokens": 3}) is None  # no reasoning_tokens stat
    plain = view.with_footer("plain", {"output_tokens": 3})
    assert "details" not in view.shown_text(plain)
    # a template's empty block (Think off): the answer alone, no fold
    sp = thinking.stored_split("<think>\n\n</think>\n\nHi", {"reasoning_tokens": 0})
    assert not thinking.has_fold(sp)
    assert view.shown_text(
        view.with_footer("<think>\n\n</think>\n\nHi", {"reasoning_tokens": 0}, split=sp)
    ).startswith("Hi")


def test_a_reply_that_starts_inside_the_block_and_one_cut_off_while_thinking():
    # the template wrote the start marker into the prompt: the reply begins inside the reasoning
    sp = thinking.stored_split("weighing it</think>Yes.", {"reasoning_tokens": 3})
    assert (sp.reasoning, sp.content, sp.reasoning_tokens) == ("weighing it", "Yes.", 3)
    cut = thinking.stored_split("<think>still going", {"reasoning_tokens": 2})
    row = view.with_footer(
        "<think>still going", {"reasoning_tokens": 2}, status="stopped", split=cut
    )
    assert "Thought for 2 tokens (stopped before answering)" in view.shown_text(row)


def test_a_streaming_reply_shows_its_reasoning_open_with_a_running_count_then_folds():
    from engine.text.reasoning import MARKERS, ReasoningSplit

    rule = ReasoningSplit(MARKERS, (300, 301), False)
    live = view.live_reply(
        "<think>hmm, let",
        True,
        {"output_tokens": 4},
        split=rule.split("<think>hmm, let", [300, 7, 8, 9]),
    )
    fold = live[0]["text"]
    assert '<details class="reasoning" open>' in fold and "Thinking… 3 tokens so far" in fold
    done = view.live_reply(
        "<think>hmm</think>Ok",
        True,
        {"output_tokens": 4},
        split=rule.split("<think>hmm</think>Ok", [300, 7, 301, 9]),
    )
    assert (
        "Thought for 1 token<" in done[0]["text"] and " open" not in done[0]["text"].split(">")[0]
    )
    assert done[1]["text"] == "Ok"


def test_alternatives_fold_their_reasoning_too():
    md = view.alternative_markdown(
        1,
        REPLY,
        {"output_tokens": 20},
        split=thinking.stored_split(REPLY, {"reasoning_tokens": 17}),
    )
    assert "Thought for 17 tokens" in md and "It is **42**." in md and "<img" not in md


def test_the_reasoning_span_in_the_chat_tokens_and_blocks():
    path = [
        {"id": 1, "role": "user", "content": "q", "token_ids": list(range(30))},
        _stored(tokens=17),
    ]
    span = thinking.last_reply_span(path, 300, 16)
    # 30 prompt tokens, the start marker at reply offset 0: reasoning at positions 31..47 -> blocks 1..2
    assert (span.tokens, span.first, span.first_block, span.last_block, span.blocks) == (
        17,
        31,
        1,
        2,
        2,
    )
    assert thinking.span_words(span) == "reasoning: 17 tokens in 2 blocks"
    assert thinking.last_reply_span(path, None, 16).first == 30  # the reply starts inside it
    assert thinking.last_reply_span(path[:1], 300, 16) is None
    plain = dict(_stored(), stats={"output_tokens": 20})  # no reasoning block
    assert thinking.last_reply_span([path[0], plain], 300, 16) is None
    total = 30 + len(path[1]["token_ids"])
    assert thinking.held_turn(path, total) and thinking.held_turn(
        path, total - 1
    )  # EOS not fed back
    assert not thinking.held_turn(path, total - 5)


def test_the_think_switch_value_and_what_a_turn_asks_for():
    assert thinking.switch_value(None) is True and thinking.switch_value({"thinking": None}) is True
    assert thinking.switch_value({"thinking": 0}) is False
    assert thinking.requested(False, True) is False and thinking.requested(True, True) is True
    assert thinking.requested(True, False) is None and thinking.requested(None, True) is None


def test_whether_a_template_feeds_past_reasoning_back():
    from tests.engine.family_chat import KEEPS_THINKING, family_tokenizer

    assert thinking.template_keeps_reasoning(family_tokenizer("qwen3")) is False
    assert thinking.template_keeps_reasoning(family_tokenizer("smollm3")) is False
    assert thinking.template_keeps_reasoning(family_tokenizer("qwen3", KEEPS_THINKING)) is True


def test_the_meter_and_the_block_table_say_where_the_reasoning_sits():
    span = thinking.ReasoningSpan(39, 118, 7, 10)
    m = context_meter.Meter(
        tokens=166,
        max_model_len=4096,
        blocks=11,
        shared_blocks=0,
        shared_tokens=0,
        own_tokens=70,
        in_memory=True,
        pinned_blocks=6,
        pinned_tokens=96,
        reasoning=span,
        reasoning_kept=False,
        reasoning_blocks=4,
    )
    html = context_meter.html(m)
    assert (
        'data-k="ctx_reasoning_tokens" data-v="39"' in html
        and 'data-k="ctx_reasoning_blocks" data-v="4"' in html
    )
    assert "left out of the next prompt" in html
    table = [
        {
            "logical": j,
            "physical": j,
            "shared": False,
            "ref_count": 1,
            "filled": 16,
            "state": "used",
        }
        for j in range(11)
    ]
    sel = {
        "key": "c",
        "label": "Hi",
        "state": "idle_session",
        "request_id": None,
        "table": table,
        "num_blocks": 11,
        "num_computed": 166,
        "last_block_filled": 6,
        "frag_tokens": 10,
        "shared_blocks": 0,
    }
    out = panels.tables_html([sel], "c", 16, reasoning=span)
    assert out.count(' r"') == 4 and 'data-k="reasoning_blocks" data-v="4"' in out
    assert "39 tokens in 4 private blocks (logical blocks 7–10)" in out
    assert panels.tables_html([sel], "c", 16).count(' r"') == 0


def test_the_picker_names_the_pool_and_refuses_in_plain_words():
    stats = {"total_blocks": 1024, "block_size": 16, "kv_bytes_per_block": 4096}
    assert (
        model_picker.pool_words(stats)
        == "KV pool 1,024 blocks of 16 tokens (16,384 tokens, 4.00 MiB)"
    )
    line = model_picker.refused(
        "broken", ValueError("cannot read config of broken: unknown model type."), "alpha"
    )
    assert (
        line
        == "**broken was not loaded:** cannot read config of broken: unknown model type. Still serving alpha."
    )
    assert "alpha keeps serving" in model_picker.loading("beta", "alpha")
