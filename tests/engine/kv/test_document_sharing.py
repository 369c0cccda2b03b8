"""A document attached to two chats (ui/chat/documents.py, issue 26.4) is prefilled once and its
blocks are shared (ref_count 2), like the system prompt: the real engine, two chat sessions whose
first message carries the same document, and the snapshot /api/kv serves."""

import pytest

from ui.chat import documents as D

pytestmark = pytest.mark.slow


def test_a_document_in_two_chats_is_stored_once(make_llm):
    from engine import SamplingParams

    llm = make_llm(num_blocks=256, max_model_len=1024)
    text = "\n".join(
        f"Line {i}: the lighthouse keeper logs wind, tide and passing ships." for i in range(20)
    )
    doc = D.Document("log.txt", text, 0)
    system = {"role": "system", "content": "You are a helpful assistant."}
    ids = {}
    for conv, question in (
        ("chat-1", "When was the wind strongest?"),
        ("chat-2", "List the ships."),
    ):
        msgs = [system, {"role": "user", "content": D.message_text([doc], question)}]
        stream = llm.submit_chat(
            msgs, SamplingParams(max_tokens=2, temperature=0.0), session_id=conv
        )
        list(stream)
        ids[conv] = list(stream.prompt_ids)
    common = next(i for i, (a, b) in enumerate(zip(ids["chat-1"], ids["chat-2"])) if a != b)
    assert common > 200  # system prompt + the whole document
    snap = llm.snapshot()
    tables = {
        s["session_id"]: s["block_table"] for s in snap["sequences"] if s["session_id"] in ids
    }
    full = common // snap["block_size"]  # blocks wholly inside the common prefix
    assert tables["chat-1"][:full] == tables["chat-2"][:full]
    refs = snap["blocks"]["ref_count"]
    assert all(refs[b] == 2 for b in tables["chat-1"][:full])
    assert all(
        refs[b] == 1 for b in tables["chat-1"][full + 1 :]
    )  # past the document: each its own
    for conv in ids:
        llm.end_session(conv)
