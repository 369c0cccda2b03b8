"""The chat page's plain view functions (no Gradio, no engine)."""

import pytest

from ui.chat import view as v


def msg(id, role, content, parent=None, stats=None, status="complete"):
    return {
        "id": id,
        "role": role,
        "content": content,
        "parent_id": parent,
        "stats": stats,
        "status": status,
    }


def test_text_of_accepts_gradio6_content_blocks():
    assert v.text_of("hi") == "hi"
    assert v.text_of([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    assert (
        v.text_of([{"type": "file", "file": {"path": "x"}}, {"type": "text", "text": "t"}]) == "t"
    )
    assert v.text_of({"text": "x"}) == "x"
    assert v.text_of(None) == ""


def test_engine_messages_put_the_system_prompt_first_and_keep_stored_text_exactly():
    path = [msg(1, "user", "Hi  "), msg(2, "assistant", " Hello!\n"), msg(3, "user", "More")]
    out = v.engine_messages("Be brief.", path)
    assert out == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi  "},
        {"role": "assistant", "content": " Hello!\n"},
        {"role": "user", "content": "More"},
    ]
    assert v.engine_messages("   ", path)[0]["role"] == "user"  # blank prompt: none sent
    assert v.engine_messages(None, []) == []


def test_path_until_cuts_after_the_message():
    path = [msg(1, "user", "a"), msg(2, "assistant", "b"), msg(3, "user", "c")]
    assert [m["id"] for m in v.path_until(path, 2)] == [1, 2]
    with pytest.raises(KeyError):
        v.path_until(path, 9)


def test_stats_line_formats_tokens_ttft_speed_and_cache():
    stats = {
        "output_tokens": 24,
        "ttft_s": 0.2049,
        "tokens_per_s": 15.66,
        "prompt_tokens": 57,
        "cached_tokens": 44,
        "finish_reason": "stop",
    }
    assert (
        v.stats_line(stats)
        == "24 tokens · TTFT 205 ms · 15.7 tok/s · reused 44 of 57 prompt tokens from cache · end of turn"
    )
    assert v.stats_line({"output_tokens": 1, "ttft_s": 1.5}) == "1 token · TTFT 1.50 s"
    assert v.stats_line({"output_tokens": 3}, "stopped") == "3 tokens · stopped"
    assert v.stats_line({"output_tokens": 3, "finish_reason": "length"}).endswith(
        "max tokens reached"
    )
    assert (
        v.stats_line({"prompt_tokens": 10, "cached_tokens": None})
        == "reused 0 of 10 prompt tokens from cache"
    )
    assert (
        v.stats_line({"prompt_tokens": 330, "cached_tokens": 312, "cached_blocks": 19})
        == "reused 312 of 330 prompt tokens from cache (19 blocks)"
    )
    assert v.stats_line(None) == "" and v.stats_line({}, "error") == "error"
    spec = {"output_tokens": 42, "spec_accepted_tokens": 17, "decode_steps": 25, "ttft_s": 0.2}
    assert (
        v.stats_line(spec) == "42 tokens · 17 accepted from drafts (1.7 tokens/step) · TTFT 200 ms"
    )
    assert (
        v.stats_line({"output_tokens": 5, "spec_accepted_tokens": 0, "decode_steps": 4})
        == "5 tokens"
    )


def test_the_footer_is_a_part_of_its_own_and_an_open_code_fence_is_closed():
    out = v.with_footer("```python\ndef f():", {"output_tokens": 2})
    assert out == [
        {"type": "text", "text": "```python\ndef f():\n```"},
        {"type": "text", "text": '<span class="reply-stats">2 tokens</span>'},
    ]
    assert v.with_footer("plain", None) == "plain"
    assert v.close_fences("```\ncode\n```\ntext") == "```\ncode\n```\ntext"
    assert v.close_fences("~~~\ncode\n") == "~~~\ncode\n~~~"
    # what counting fence lines got wrong (issue 47): a longer fence, a fence line that is content,
    # a fence inside a list item (closed by its list: a closer there would open a new block)
    assert (
        v.close_fences("````md\n```python\nx\n```\nmore") == "````md\n```python\nx\n```\nmore\n````"
    )
    assert (
        v.close_fences("```markdown\n```python\nprint()\n```\nessay")
        == "```markdown\n```python\nprint()\n```\nessay"
    )
    assert (
        v.close_fences("1. Here:\n\n   ```python\n   code") == "1. Here:\n\n   ```python\n   code"
    )
    assert v.stats_line({"output_tokens": 256}, total_tokens=512) == "+256 tokens (512 total)"
    assert v.stats_line({"output_tokens": 256}, total_tokens=256) == "256 tokens"


def test_display_messages_show_user_and_assistant_rows_with_their_stored_ids():
    path = [
        msg(1, "system", "sys"),
        msg(2, "user", "Hi"),
        msg(3, "assistant", "Hello", stats={"output_tokens": 1}, status="stopped"),
    ]
    shown, ids = v.display_messages(path)
    assert ids == [2, 3]
    assert shown[0] == {"role": "user", "content": "Hi"}
    body, footer = shown[1]["content"]
    assert body["text"] == "Hello" and "1 token · stopped" in footer["text"]


def test_live_reply_goes_from_queued_to_text():
    assert v.live_reply("", admitted=False) == v.QUEUED
    assert "queued" in v.QUEUED
    assert v.live_reply("", admitted=True) == v.STARTING
    assert v.live_reply("Hel", admitted=True) == "Hel"
    assert "1 token" in v.shown_text(v.live_reply("Hel", True, {"output_tokens": 1}))


def test_notices():
    n = v.too_long_notice(900, 512)
    assert "too long" in n and "900" in n and "512" in n
    assert "boom" in v.error_notice("boom")


def test_sampling_kwargs_map_widget_values():
    kw = v.sampling_kwargs(0.7, 0.9, 0, 64.0, 1.1, None, 2.0)
    assert kw == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 64,
        "repetition_penalty": 1.1,
        "seed": None,
        "n": 2,
    }
    assert v.sampling_kwargs(0, 1, 40, 8, 1, 7.0, 1)["seed"] == 7
    assert v.sampling_kwargs(0, 1, 40, 8, 1, -1, 1)["seed"] is None
    assert v.sampling_kwargs(0, 1, 40, 8, 1, "", 1)["top_k"] == 40
    assert v.sampling_kwargs(0, 1, 0, 8, 1, None, 99)["n"] == v.MAX_ALTERNATIVES
    from engine.sampling.sampling_params import SamplingParams

    SamplingParams(**v.sampling_kwargs(0.7, 0.95, 0, 256, 1.1, -1, 1))  # accepted by the engine


def test_conversation_choices_and_filenames_and_prompt_summary():
    rows = [{"id": "a", "title": "First"}, {"id": "b", "title": ""}]
    assert v.conversation_choices(rows) == [("First", "a"), ("Untitled", "b")]
    assert v.export_filename("Hello, world / 2?", "json") == "Hello-world-2.json"
    assert v.export_filename("", "md") == "conversation.md"
    assert "own system prompt" in v.prompt_summary("x", 1, 1)
    assert "older shared prompt (#1)" in v.prompt_summary(None, 1, 2)
    assert "shared system prompt (#2)" in v.prompt_summary(None, 2, 2)


def test_alternative_markdown_labels_the_one_on_screen():
    a0 = v.alternative_markdown(0, "x", {"output_tokens": 1}, chosen=True)
    a1 = v.alternative_markdown(1, "", None, admitted=False)
    assert "Alternative 1" in a0 and "shown in the conversation" in a0 and "1 token" in a0
    assert "shown in the conversation" not in v.alternative_markdown(0, "x", None)
    assert "Beam 2" in v.alternative_markdown(1, "y", None, label="Beam")
    assert "Alternative 2" in a1 and "queued" in a1


def test_stored_replies_carry_their_markdown_source_for_copying_and_user_rows_do_not():
    import base64
    import re

    source = "**Bold** & <tag>\n\n```py\nx = 1\n```\n\n- item"
    path = [
        msg(1, "user", "Hi"),
        msg(2, "assistant", source, stats={"output_tokens": 9}),
        msg(3, "user", "Again"),
        msg(4, "assistant", source),
    ]  # the second without stats
    shown, _ = v.display_messages(path)
    for row in (shown[1], shown[3]):
        titles = re.findall(
            r'<span class="md-src" hidden title="([A-Za-z0-9+/=]*)"></span>',
            v.shown_text(row["content"]),
        )
        assert len(titles) == 1 and base64.b64decode(titles[0]).decode() == source
        assert "md-src" not in row["content"][0]["text"]  # the source rides in the footer part
    assert shown[1]["content"][0]["text"].startswith("**Bold**")
    assert (
        "md-src" not in shown[0]["content"] + shown[2]["content"]
    )  # a user row is what the edit box shows
    assert "md-src" not in v.shown_text(
        v.live_reply("partial", True, {"output_tokens": 1})
    )  # not on streamed repaints
