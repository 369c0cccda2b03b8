"""History in SQLite survives the app: SIGTERM mid-reply (clean shutdown), restart and continue,
then SIGKILL mid-reply (no cleanup at all)."""

import time

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow

LONG = 400  # max tokens of the replies interrupted on purpose


def _rows(api, db, conv):
    return api.read_db(
        db,
        "SELECT role, content, status FROM messages WHERE conversation_id = ? ORDER BY id",
        (conv,),
    )


def _interrupt_mid_reply(api, client, db, conv, prompt):
    """Start a long reply and return once its partial text is streaming and stored."""
    job = client.submit(prompt, *api.sampling(max_tokens=LONG), api_name="/send")
    api.wait_for(lambda: len(api.streaming_text(job) or "") > 20)
    api.wait_for(
        lambda: [
            r for r in _rows(api, db, conv) if r["role"] == "assistant" and r["status"] == "stopped"
        ],
        timeout=10,
    )
    return job


def test_sigterm_restart_then_sigkill_keep_every_committed_message(launch, tmp_path, chat_api):
    api = chat_api
    db = tmp_path / "chat.db"
    first = launch(db)
    c = Client(first.url, verbose=False)
    out = c.predict("My name is Ada. Remember it.", *api.sampling(max_tokens=8), api_name="/send")
    conv = api.conversation_id(out)
    reply = api.reply_text(out).split("\n\n<span")[0]
    _interrupt_mid_reply(api, c, db, conv, "Tell me a very long story about Ada.")
    started = time.time()
    assert first.stop() == 0  # SIGTERM (as Ctrl-C): a clean exit...
    assert time.time() - started < 15  # ...that does not wait for the reply
    assert "Bye." in first.log() and "Traceback" not in first.log()
    c.close()
    rows = _rows(api, db, conv)
    assert [r["status"] for r in rows] == ["complete", "complete", "complete", "stopped"]
    assert rows[3]["content"]  # the partial reply was kept

    second = launch(db)
    c = Client(second.url, verbose=False)
    listed = c.predict("", api_name="/search")
    assert conv in [ch[1] for ch in listed["choices"]]
    opened = c.predict(conv, api_name="/open_conversation")
    shown = [(m["role"], api.text_of(m["content"]).split("\n\n<span")[0]) for m in opened[0]]
    assert shown[:2] == [("user", "My name is Ada. Remember it."), ("assistant", reply)]
    assert len(shown) == 4 and "stopped" in api.text_of(opened[0][3]["content"])
    out = c.predict("What is my name?", *api.sampling(max_tokens=8), api_name="/send")
    assert api.conversation_id(out) == conv  # the same conversation continues
    assert len(api.chat_rows(out)) == 6

    # SIGKILL mid-reply: every message committed before the kill is still there.
    _interrupt_mid_reply(api, c, db, conv, "Now write a very long poem about your memory.")
    second.kill()
    rows = _rows(api, db, conv)
    assert [r["role"] for r in rows] == ["user", "assistant"] * 4
    assert rows[6]["content"] == "Now write a very long poem about your memory."
    assert rows[5]["status"] == "complete"
    assert (
        rows[7]["status"] == "stopped" and rows[7]["content"]
    )  # the partial reply, honestly marked
