"""JSON export/import round trip, import validation, Markdown export."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def shape(export):
    """An export without ids or timestamps, with parents as list positions: what must survive."""
    pos = {m["id"]: i for i, m in enumerate(export["messages"])}
    messages = []
    for m in export["messages"]:
        kept = {k: v for k, v in m.items() if k not in ("id", "parent_id")}
        messages.append({**kept, "parent": pos.get(m["parent_id"])})
    return {"title": export["conversation"]["title"], "system_prompt": export["system_prompt"],
            "messages": messages}  # fmt: skip


@pytest.fixture
def branched(store, make_chat):
    conv, (u1, a1, u2, a2) = make_chat("q1", "a1", "q2", "a2")
    store.update_message(a2["id"], token_ids=[5, 6, 2])
    store.add_reply_stats(
        a2["id"], prompt_tokens=30, output_tokens=3, ttft_s=0.5, finish_reason="stop"
    )
    regen = store.add_sibling(a2["id"], "a2 again", token_ids=[7, 2], status="stopped")
    store.add_reply_stats(regen["id"], output_tokens=2, tokens_per_s=12.5)
    store.set_conversation_system_prompt(conv["id"], "Custom prompt\nsecond line")
    return conv


def test_json_round_trip(store, branched):
    exported = store.export_json(branched["id"])
    assert json.loads(json.dumps(exported)) == exported  # plain JSON types only
    assert len(exported["messages"]) == 5
    copy = store.import_json(json.loads(json.dumps(exported)), owner="ann")
    assert copy["id"] != branched["id"] and copy["owner"] == "ann"
    again = store.export_json(copy["id"])
    assert shape(again) == shape(exported)
    active = lambda cid: [(m["content"], m["stats"]) for m in store.get_messages(cid)]  # noqa: E731
    assert active(copy["id"]) == active(branched["id"])
    assert (
        store.get_conversation(copy["id"])["system_prompt_override"] == "Custom prompt\nsecond line"
    )


def test_import_binds_known_prompt_and_accepts_json_text(store, make_chat):
    conv, _ = make_chat("hi")
    text = json.dumps(store.export_json(conv["id"]))
    store.set_system_prompt("A newer shared prompt")
    copy = store.import_json(text)
    assert copy["system_prompt_id"] == conv["system_prompt_id"]
    assert copy["system_prompt_override"] is None


def _valid():
    return {
        "format": "llm-chat-conversation",
        "version": 1,
        "conversation": {"title": "t"},
        "system_prompt": None,
        "messages": [{"id": 1, "parent_id": None, "role": "user", "content": "x"}],
    }


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda d: "not json {", "not valid JSON"),
        (lambda d: [d], "JSON object"),
        (lambda d: {**d, "format": "other"}, "format"),
        (lambda d: {**d, "version": 2}, "version"),
        (lambda d: {**d, "conversation": {"title": ""}}, "title"),
        (lambda d: {**d, "messages": {}}, "messages must be a list"),
        (lambda d: {**d, "system_prompt": 5}, "system_prompt"),
        (lambda d: d["messages"].append({**d["messages"][0]}) or d, r"messages\[1\]: duplicate id"),
        (lambda d: d["messages"][0].update(parent_id=7) or d, r"messages\[0\]: parent_id"),
        (lambda d: d["messages"][0].update(parent_id=[1]) or d, "parent_id"),
        (lambda d: d["messages"][0].update(role="bot") or d, "role"),
        (lambda d: d["messages"][0].update(content=None) or d, "content"),
        (lambda d: d["messages"][0].update(token_ids=[1.5]) or d, "token_ids"),
        (lambda d: d["messages"][0].update(stats={"speed": 1}) or d, "unknown stats"),
    ],
)
def test_import_rejects_bad_data_clearly(store, mutate, error):
    with pytest.raises(ValueError, match=error):
        store.import_json(mutate(_valid()))
    assert store.list_conversations() == []  # nothing half-written


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
message_like = st.fixed_dictionaries(
    {"id": st.integers(0, 3), "role": st.sampled_from(["user", "assistant", "bot"])},
    optional={"parent_id": st.none() | st.integers(0, 3), "content": st.text(max_size=5) | json_values,
              "token_ids": json_values, "stats": json_values, "status": json_values},
)  # fmt: skip
documents = st.fixed_dictionaries(
    {"format": st.just("llm-chat-conversation"), "version": st.just(1),
     "conversation": st.fixed_dictionaries({"title": st.text(max_size=5)}),
     "messages": st.lists(message_like, max_size=4)},
    optional={"system_prompt": json_values},
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=documents | json_values)
def test_import_fuzz_only_value_errors(store, doc):
    """Arbitrary input either imports and round-trips, or fails with ValueError - nothing else."""
    try:
        conv = store.import_json(doc)
    except ValueError:
        return
    exported = store.export_json(conv["id"])
    assert [m["content"] for m in exported["messages"]] == [m["content"] for m in doc["messages"]]


def test_markdown_export(store, branched):
    md = store.export_markdown(branched["id"])
    assert md.startswith("# q1\n")
    assert "**System prompt:**\n\n> Custom prompt\n> second line\n" in md
    assert (
        "## User\n\nq1\n\n## Assistant\n\na1\n\n## User\n\nq2\n\n## Assistant\n\na2 again\n" in md
    )
    assert "_(stopped)_" in md and "_2 tokens · 12.5 tok/s_" in md
    assert "\na2\n" not in md  # only the active branch
    assert md.endswith("\n") and not md.endswith("\n\n")


def test_markdown_export_closes_a_reply_left_inside_a_code_block(store):
    """Issue 47: a reply cut by max tokens inside a code block kept its open fence in the export,
    and the rest of the document read as code. Each text is exact, then a closing fence if needed."""
    conv = store.create_conversation()
    store.add_message(conv["id"], "user", "Show code")
    reply = "Here:\n\n````md\n```python\nprint('hi')\n```\nstill inside"
    store.add_message(conv["id"], "assistant", reply, status="stopped")
    store.add_message(conv["id"], "user", "Thanks")
    md = store.export_markdown(conv["id"])
    assert f"## Assistant\n\n{reply}\n````\n\n_(stopped)_\n\n## User\n\nThanks\n" in md


def test_a_chat_is_titled_by_what_was_typed_not_by_an_attached_documents_wrapper(store):
    conv = store.create_conversation()
    store.add_message(
        conv["id"],
        "user",
        '<document name="memo.pdf">\nProject plan\n</document>\n\nSummarize it please',
    )
    assert store.get_conversation(conv["id"])["title"] == "Summarize it please"
    only = store.create_conversation()
    store.add_message(
        only["id"],
        "user",
        '<document name="a.txt">\nx\n</document>\n\n<document name="b.md">\ny\n</document>\n\n',
    )
    assert store.get_conversation(only["id"])["title"] == "a.txt, b.md"
