"""A gpt-oss (harmony) reply in the chat: the stored reply (channel markers kept) folds its analysis
above the final answer, as a <think> reply does; a reply with no analysis shows its answer alone,
never a marker; the template is known to drop past analysis. Pure functions, checked directly."""

from ui.chat import thinking, view

REPLY = (
    "<|channel|>analysis<|message|>Weigh <img src=x onerror=alert(1)></details> it.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is **42**."
)


def test_a_harmony_reply_folds_its_analysis_and_shows_no_marker():
    stored = {
        "id": 2,
        "role": "assistant",
        "content": REPLY,
        "status": "complete",
        "token_ids": list(range(3, 30)),
        "stats": {"output_tokens": 27, "reasoning_tokens": 9},
    }
    shown, _ = view.display_messages(
        [{"id": 1, "role": "user", "content": "q"}, stored], eos_ids=set()
    )
    fold, answer, _footer = (p["text"] for p in shown[1]["content"])
    assert fold.startswith('<details class="reasoning"><summary>Thought for 9 tokens</summary>')
    assert "&lt;img" in fold and "<img" not in fold and fold.count("</details>") == 1
    assert answer == "It is **42**." and "<|" not in fold + answer
    direct = "<|channel|>final<|message|>Just this."
    sp = thinking.stored_split(direct, {"reasoning_tokens": 0})
    assert not thinking.has_fold(sp)
    assert view.shown_text(view.with_footer(direct, {"reasoning_tokens": 0}, split=sp)).startswith(
        "Just this."
    )


def test_the_harmony_template_drops_past_analysis():
    from tests.engine.family_chat import family_tokenizer

    assert thinking.template_keeps_reasoning(family_tokenizer("gpt_oss")) is False
