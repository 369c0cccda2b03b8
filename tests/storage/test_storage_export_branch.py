"""Export follows the branch on screen (active_branch), not the newest leaf: the Markdown is that
branch, the JSON names it (and still holds every message), and an import shows it again."""

import json

import pytest


@pytest.fixture
def two_branches(store, make_chat):
    """q1 -> A1 -> "old follow-up" -> A-old, and an edit of q1 -> A-new (the newest leaf); the
    older branch is selected, as after clicking "< 1/2"."""
    conv, (u1, a1, u2, a2) = make_chat("first question", "A1", "old follow-up", "A-old")
    store.add_sibling(u1["id"], "first question, edited")
    store.add_message(conv["id"], "assistant", "A-new")
    store.select_branch(u1["id"])
    return conv, [u1, a1, u2, a2]


def test_markdown_export_is_the_selected_older_branch(store, two_branches):
    conv, old = two_branches
    md = store.export_markdown(conv["id"])
    for m in old:
        assert m["content"] in md
    assert "A-new" not in md and "edited" not in md


def test_json_export_names_the_selected_branch_and_import_shows_it(store, two_branches):
    conv, old = two_branches
    data = store.export_json(conv["id"])
    assert data["active_branch"] == [m["id"] for m in old]
    assert data["active_message_id"] == old[0]["id"]
    assert len(data["messages"]) == 6  # every branch is still in the file
    copy = store.import_json(json.loads(json.dumps(data)))
    assert [m["content"] for m in store.get_messages(copy["id"])] == [m["content"] for m in old]
    versions = store.branch_versions(copy["id"])
    assert len(versions[store.get_messages(copy["id"])[0]["id"]]) == 2  # the newer branch came too


def test_import_refuses_an_active_message_that_is_not_in_the_file(store, two_branches):
    conv, _ = two_branches
    data = store.export_json(conv["id"])
    data["active_message_id"] = 10_000
    with pytest.raises(ValueError, match="active_message_id"):
        store.import_json(data)
    data.pop("active_message_id")  # an older export: the newest leaf shows
    copy = store.import_json(data)
    assert store.get_messages(copy["id"])[-1]["content"] == "A-new"
