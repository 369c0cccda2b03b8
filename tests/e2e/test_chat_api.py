"""The chat app through its API (gradio_client) against a real app process: concurrent clients
sharing the system prompt's KV blocks, release on close, queueing, bad input, Stop, branches."""

import json
import time

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow

# ~65 tokens once templated: at least 3 full 16-token blocks that every new chat shares.
SHARED_PROMPT = (
    "You are a friendly assistant for a small bakery. You answer questions about bread, "
    "cakes, opening hours and prices. Keep every answer short, kind and practical, and "
    "never invent products the bakery does not sell. If you do not know something, say "
    "so and suggest calling the shop."
)


def _owners_by_session(snap: dict) -> dict[int, set]:
    """block id -> the conversation (session) ids holding it."""
    session_of = {
        s["seq_id"]: s["session_id"] for s in snap["sequences"] if s["seq_id"] is not None
    }
    out = {}
    for block, owners in snap["owners"].items():
        out[int(block)] = {session_of.get(o, o) for o in owners}
    return out


def test_two_clients_stream_at_once_and_share_the_system_prompt_blocks(module_server, chat_api):
    api = chat_api
    a, b = Client(module_server.url, verbose=False), Client(module_server.url, verbose=False)
    a.predict(SHARED_PROMPT, api_name="/set_shared_prompt")
    ja = a.submit("Do you sell rye bread?", *api.sampling(max_tokens=40), api_name="/send")
    api.wait_for(lambda: api.streaming_text(ja))
    jb = b.submit("When do you open on Sunday?", *api.sampling(max_tokens=40), api_name="/send")
    api.wait_for(lambda: api.streaming_text(jb))
    conv_a = api.conversation_id(ja.outputs()[0])
    conv_b = api.conversation_id(jb.outputs()[0])
    assert conv_a and conv_b and conv_a != conv_b

    # While both replies stream, the prompt's blocks are held by both conversations (ref_count >= 2).
    snap = module_server.kv()
    running = {s["session_id"] for s in snap["sequences"] if s["state"] == "running"}
    assert {conv_a, conv_b} <= running, snap["sequences"]
    owners = _owners_by_session(snap)
    shared = [
        blk
        for blk, holders in owners.items()
        if snap["blocks"]["ref_count"][blk] >= 2 and {conv_a, conv_b} <= holders
    ]
    assert len(shared) >= 3, (shared, snap["stats"])

    ra, rb = ja.result(timeout=120), jb.result(timeout=120)
    for job, final in ((ja, ra), (jb, rb)):
        texts = [api.reply_text(o) for o in job.outputs() if api.reply_text(o)]
        assert len(set(texts)) >= 3, "the reply should arrive in several streamed pieces"
        assert "prompt tokens from cache" in api.reply_text(final)
    # The second conversation found the first one's system-prompt blocks in the prefix cache.
    stats = api.read_db(
        module_server.db,
        "SELECT s.cached_tokens FROM reply_stats s JOIN messages m "
        "ON m.id = s.message_id WHERE m.conversation_id = ?",
        (conv_b,),
    )
    assert stats and stats[0]["cached_tokens"] >= 48

    # Finished conversations stay open (parked) until their tabs close; then nothing is held.
    assert module_server.kv()["stats"]["used_blocks"] > 0
    assert a.predict(api_name="/close_tab") == "closed"  # explicit goodbye (a client that only
    assert (
        b.predict(api_name="/close_tab") == "closed"
    )  # disconnects is swept after ui/chat/tab_goodbye.SILENT_S)
    b.close()
    snap = module_server.wait_kv(lambda s: s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"])
    assert snap["stats"]["used_blocks"] == snap["stats"]["pinned_blocks"], snap["sequences"]
    a.close()


def test_empty_and_too_long_messages(module_server, chat_api):
    api = chat_api
    c = Client(module_server.url, verbose=False)
    before = api.read_db(module_server.db, "SELECT count(*) AS n FROM messages")[0]["n"]
    out = c.predict("   ", *api.sampling(), api_name="/send")
    assert api.chat_rows(out) is None  # ignored: nothing on the page changes
    huge = "please remember this word " * 200  # > 512 tokens of context
    out = c.predict(huge, *api.sampling(), api_name="/send")
    assert "too long" in api.reply_text(out)
    assert "512 tokens" in api.reply_text(out)
    assert api.read_db(module_server.db, "SELECT count(*) AS n FROM messages")[0]["n"] == before
    stats = module_server.kv()["stats"]
    assert stats["running"] == 0 and stats["waiting"] == 0
    out = c.predict(
        "Hi!", *api.sampling(max_tokens=4), api_name="/send"
    )  # the engine still answers
    assert api.reply_text(out) and "prompt tokens from cache" in api.reply_text(out)
    c.predict(api_name="/close_tab")
    c.close()


def test_more_conversations_than_max_num_seqs_wait_queued(module_server, chat_api):
    """The server runs at most 2 sequences; a third conversation shows 'queued' until one ends."""
    api = chat_api
    clients = [Client(module_server.url, verbose=False) for _ in range(3)]
    jobs = [
        clients[i].submit(
            f"Write a long story about a baker called Sam number {i}.",
            *api.sampling(max_tokens=60),
            api_name="/send",
        )
        for i in range(2)
    ]
    for j in jobs:
        api.wait_for(lambda j=j: api.streaming_text(j))
    third = clients[2].submit(
        "And what is a croissant?", *api.sampling(max_tokens=8), api_name="/send"
    )
    api.wait_for(lambda: third.outputs())
    time.sleep(0.5)
    assert module_server.kv()["stats"]["waiting"] >= 1
    assert "queued" in api.reply_text(third.outputs()[-1])  # shown as waiting, not failed
    assert not any(j.done() for j in jobs)
    assert api.reply_text(third.result(timeout=120))  # and answered once a slot freed
    for j in jobs:
        j.result(timeout=120)
    for c in clients:
        c.predict(api_name="/close_tab")
        c.close()
    st = module_server.wait_kv(lambda s: s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"])[
        "stats"
    ]
    assert st["used_blocks"] == st["pinned_blocks"]  # only the app's pinned shared prompt stays


def test_turns_reuse_the_session_then_regenerate_alternatives_and_stop(module_server, chat_api):
    api = chat_api
    c = Client(module_server.url, verbose=False)
    out = c.predict("Name one bread.", *api.sampling(max_tokens=8), api_name="/send")
    conv = api.conversation_id(out)
    out = c.predict("And one cake?", *api.sampling(max_tokens=8), api_name="/send")
    rows = api.read_db(
        module_server.db,
        "SELECT m.role, m.status, m.token_ids, s.prompt_tokens, s.cached_tokens "
        "FROM messages m LEFT JOIN reply_stats s ON s.message_id = m.id "
        "WHERE m.conversation_id = ? ORDER BY m.id",
        (conv,),
    )
    assert [r["role"] for r in rows] == ["user", "assistant", "user", "assistant"]
    second = rows[3]
    assert second["status"] == "complete" and second["token_ids"]
    # The second turn prefilled only its new tokens: the first turn's KV stayed in the session.
    assert second["prompt_tokens"] - second["cached_tokens"] <= 24, second

    # Regenerate with 2 alternatives side by side: a new sibling reply, the old one kept.
    out = c.predict(
        *api.sampling(max_tokens=6, n=2, temperature=1.0, seed=7), api_name="/regenerate"
    )
    alts = [
        o for o in out[4:] if isinstance(o, dict) and o.get("visible")
    ]  # (the Row is not in the API)
    assert len(alts) == 2 and all("Alternative" in a["value"] for a in alts)
    rows = api.read_db(
        module_server.db, "SELECT role FROM messages WHERE conversation_id = ?", (conv,)
    )
    assert [r["role"] for r in rows].count(
        "assistant"
    ) == 4  # both alternatives stored (versions of the reply)

    # Stop mid-reply (the tab's Stop, /stop): the request is aborted and the partial reply stays
    # stored as "stopped". (Not the client's cancel: that only stops painting, the reply belongs to
    # the server, ui/chat/reattach.py. A streamed reply's row is "stopped" until it completes, so
    # the status is read once the engine is idle. The prompt's greedy reply runs to max_tokens.)
    c.predict(api_name="/new_chat")  # a fresh chat: a greedy reply that runs to max_tokens
    job = c.submit(
        "Write a long story about a baker called Sam.",
        *api.sampling(max_tokens=400),
        api_name="/send",
    )
    api.wait_for(lambda: api.streaming_text(job))
    c.predict(api_name="/stop")
    snap = module_server.wait_kv(lambda s: s["stats"]["running"] == 0, timeout=60)  # a loaded box
    assert snap["stats"]["running"] == 0
    last = api.read_db(
        module_server.db,
        "SELECT status, content, token_ids FROM messages WHERE role = 'assistant' "
        "ORDER BY id DESC LIMIT 1",
    )[0]
    assert last["status"] == "stopped" and last["content"]
    assert len(json.loads(last["token_ids"])) < 400  # cut short, not run to max_tokens
    c.predict(api_name="/close_tab")
    c.close()
    st = module_server.wait_kv(lambda s: s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"])[
        "stats"
    ]
    assert st["used_blocks"] == st["pinned_blocks"]  # only the app's pinned shared prompt stays


def _download(server, link_html: str, to):
    """Fetch an export through the download link the app shows, into `to`; its path."""
    import re
    import urllib.request

    href = re.search(r'href="([^"]+)"', link_html).group(1)
    with urllib.request.urlopen(server.url + href, timeout=30) as r:
        to.write_bytes(r.read())
    return str(to)


def test_sidebar_search_rename_export_delete_import(module_server, chat_api, tmp_path):
    api = chat_api
    c = Client(module_server.url, verbose=False)
    out = c.predict(
        "Do you have gluten-free muffins?", *api.sampling(max_tokens=6), api_name="/send"
    )
    conv = api.conversation_id(out)
    found = c.predict("muffins", api_name="/search")
    assert conv in [ch[1] for ch in found["choices"]]
    listed = c.predict("Muffin question", api_name="/rename")
    assert ["Muffin question", conv] in listed["choices"]
    exported = _download(
        module_server, c.predict(api_name="/export_json"), tmp_path / "export.json"
    )
    md = _download(module_server, c.predict(api_name="/export_markdown"), tmp_path / "export.md")
    assert "gluten-free muffins" in open(md, encoding="utf-8").read()

    # Deleting the open conversation releases its engine session (its parked KV blocks).
    assert conv in {s["session_id"] for s in module_server.kv()["sequences"]}
    after = c.predict(api_name="/delete")
    assert conv not in [ch[1] for ch in after[2]["choices"]]
    snap = module_server.wait_kv(lambda s: conv not in {q["session_id"] for q in s["sequences"]})
    assert conv not in {s["session_id"] for s in snap["sequences"]}
    assert not api.read_db(
        module_server.db, "SELECT id FROM messages WHERE conversation_id = ?", (conv,)
    )

    # Importing the export brings it back as a new conversation, opened in this tab.
    from gradio_client import handle_file

    imported = c.predict(handle_file(exported), api_name="/import_json")
    new_conv = imported[2]["value"]
    assert new_conv and new_conv != conv
    assert [api.text_of(m["content"]) for m in imported[0]][0] == "Do you have gluten-free muffins?"
    c.predict(api_name="/close_tab")
    c.close()


def test_shared_prompt_for_new_chats_and_a_per_conversation_override(module_server, chat_api):
    api = chat_api
    c = Client(module_server.url, verbose=False)
    c.predict(api_name="/new_chat")
    text, line, listed = c.predict("You are a pirate. Answer like one.", api_name="/set_override")
    conv = listed["value"]  # no chat was open: one is created for it
    assert text == "You are a pirate. Answer like one." and "own system prompt" in line
    out = c.predict("Hello!", *api.sampling(max_tokens=4), api_name="/send")
    assert api.conversation_id(out) == conv
    row = api.read_db(
        module_server.db, "SELECT system_prompt_override FROM conversations WHERE id = ?", (conv,)
    )
    assert row == [{"system_prompt_override": "You are a pirate. Answer like one."}]
    text, line, _ = c.predict(api_name="/reset_override")
    assert text == "" and "shared system prompt" in line

    # A new shared prompt is used by conversations created afterwards; older ones keep theirs.
    new_prompt, line = c.predict("You are terse.", api_name="/set_shared_prompt")
    assert new_prompt == "You are terse." and "older shared prompt" in line
    c.predict(api_name="/new_chat")
    out = c.predict("Hi", *api.sampling(max_tokens=4), api_name="/send")
    fresh = api.conversation_id(out)
    rows = api.read_db(
        module_server.db,
        "SELECT c.id, p.text FROM conversations c JOIN system_prompts p "
        "ON p.id = c.system_prompt_id WHERE c.id IN (?, ?)",
        (conv, fresh),
    )
    assert {r["id"]: r["text"] for r in rows}[fresh] == "You are terse."
    assert {r["id"]: r["text"] for r in rows}[conv] != "You are terse."
    c.predict(api_name="/close_tab")
    c.close()
