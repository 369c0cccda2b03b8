"""Issue #12, UI side, against a real app process with --auth (real model, real SQLite):
per-user cache salt (2), size limits and a stream that never stalls (5), owner check on per-tab
calls (10), validation before storing (11), a conversation deleted mid-reply (14)."""

import json
import math
import threading
import time

import pytest
from gradio_client import Client, handle_file

from storage import Storage
from tests.e2e.conftest import (
    AppServer,
    conversation_id,
    read_db,
    reply_text,
    sampling,
    streaming_text,
)
from tests.e2e.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
USERS = {"alice": "wonderland", "bob": "builder", "carol": "pw-carol"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    args = ["--num-blocks", "512", "--max-model-len", "512", "--max-num-seqs", "4"]
    for u, p in USERS.items():
        args += ["--auth", f"{u}:{p}"]
    s = AppServer(tmp / "chat.db", args, tmp / "app.log")
    try:
        yield s.wait_ready()
    finally:
        s.kill()


def client(server, user):
    return Client(server.url, auth=(user, USERS[user]), verbose=False)


def count(server, table):
    return read_db(server.db, f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]


def refused(call) -> str:
    """Run a call that must be refused; its error text."""
    with pytest.raises(Exception) as info:
        call()
    return str(info.value)


def post(server, path, as_client, payload):
    """POST JSON with `as_client`'s login cookie; (status, body)."""
    import urllib.error
    import urllib.request

    cookie = "; ".join(f"{k}={v}" for k, v in as_client.cookies.items())
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Cookie": cookie},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def long_reply(c, text="Write a long story about a lighthouse keeper and the sea."):
    """Start a greedy reply that runs for a while; return the job once text streams."""
    job = c.submit(text, *sampling(max_tokens=300), api_name="/send")
    wait_until(lambda: streaming_text(job), timeout=120, what="streaming")
    return job


def test_stolen_session_hash_cannot_stop_read_or_release(server):
    alice, bob = client(server, "alice"), client(server, "bob")
    job = long_reply(alice)
    bob.session_hash = alice.session_hash  # bob replays alice's tab id
    # Each call is refused: the server raises TabOwnerError before touching the tab. bob queues
    # the calls with raw HTTP (his login cookie, alice's hash) and opens no event stream of his
    # own: two clients reading one session hash's stream would steal each other's messages.
    before = server.log().count("ui.chat.guard.TabOwnerError:")
    for api_name in ("/stop", "/stop", "/close_tab"):
        post(
            server,
            "gradio_api/queue/join",
            bob,
            {
                "data": [],
                "fn_index": alice._infer_fn_index(api_name, None),
                "session_hash": alice.session_hash,
                "trigger_id": None,
            },
        )
        wait_until(
            lambda: server.log().count("ui.chat.guard.TabOwnerError:") > before,
            timeout=30,
            what=f"{api_name} refused",
        )
        before += 1
    job.result(timeout=180)  # alice's reply runs to its end
    conv = next(conversation_id(o) for o in job.outputs() if conversation_id(o))
    row = read_db(
        server.db,
        "SELECT status FROM messages WHERE conversation_id = ? AND role = 'assistant'",
        (conv,),
    )
    assert row == [{"status": "complete"}]  # bob's stops did nothing
    assert alice.predict(api_name="/close_tab") == "closed"
    alice.close()


REPLY_FREE = [
    "Free text",
    "",
    True,
]  # /send's reply format and schema (ui/chat/reply_format.py), Think on


def queue_raw(server, as_client, api_name, data) -> None:
    """Queue a call the way a hand-written client would (raw JSON: NaN and lone surrogates, which
    gradio_client cannot send), with `as_client`'s login and a fresh session hash."""
    import uuid

    status, body = post(
        server,
        "gradio_api/queue/join",
        as_client,
        {
            "data": data,
            "fn_index": as_client._infer_fn_index(api_name, None),
            "session_hash": uuid.uuid4().hex[:11],
            "trigger_id": None,
        },
    )
    assert status == 200, body


def refused_in_log(server, text) -> None:
    wait_until(lambda: text in server.log(), timeout=30, what=f"refusal {text!r}")


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(top_p=math.nan), "top_p"),
        (dict(temperature=1e-40), "temperature"),
        (
            dict(repetition_penalty=math.nan),
            "repetition_penalty",
        ),  # (inf: Gradio's slider bounds refuse it)
    ],
)
def test_bad_sampling_values_are_refused_before_anything_is_stored(server, bad, field):
    alice = client(server, "alice")
    values = dict(
        zip(
            ["temperature", "top_p", "top_k", "max_tokens", "repetition_penalty", "seed", "n"],
            sampling(max_tokens=4),
        )
    )
    values.update(bad)
    convs, msgs = count(server, "conversations"), count(server, "messages")
    before = server.log().count("Sampling settings not accepted")
    queue_raw(server, alice, "/send", [f"hello {field}", *values.values(), "sample", *REPLY_FREE])
    wait_until(
        lambda: server.log().count("Sampling settings not accepted") > before,
        timeout=30,
        what="the refusal",
    )
    assert f"SamplingParams.{field}" in server.log().split("Sampling settings not accepted")[-1]
    assert (count(server, "conversations"), count(server, "messages")) == (convs, msgs)
    alice.close()


def test_lone_surrogates_huge_searches_and_long_titles_get_clear_errors(server):
    alice = client(server, "alice")
    convs, msgs = count(server, "conversations"), count(server, "messages")
    queue_raw(server, alice, "/send", ["hi \ud800 there", *sampling(4), "sample", *REPLY_FREE])
    refused_in_log(server, "The message contains an invalid character (a lone UTF-16 surrogate)")
    assert "search text is too long" in refused(
        lambda: alice.predict("(" * 50_000, api_name="/search")
    )
    assert "message is too long" in refused(
        lambda: alice.predict("x" * 200_001, *sampling(4), api_name="/send")
    )
    assert "title is too long" in refused(lambda: alice.predict("t" * 1000, api_name="/rename"))
    assert "system prompt is too long" in refused(
        lambda: alice.predict("p" * 30_000, api_name="/set_override")
    )
    assert (count(server, "conversations"), count(server, "messages")) == (convs, msgs)
    alice.close()


def _max_gap_during(job, action) -> tuple[float, object]:
    """Run `action` while `job` streams; the longest gap between two stream updates meanwhile."""
    stamps, stop = [], threading.Event()

    def watch():
        seen = 0
        while not stop.is_set():
            n = len(job.outputs())
            if n != seen:
                seen = n
                stamps.append(time.monotonic())
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.5)
    start = time.monotonic()
    try:
        result = action()
    finally:
        end = time.monotonic()
        time.sleep(0.5)
        stop.set()
        t.join()
    window = [s for s in stamps if s >= start - 0.5] + [end]
    gaps = [b - a for a, b in zip(window, window[1:])]
    assert not job.done(), "the stream ended before the action: make the reply longer"
    return max(gaps), result


def test_another_users_stream_never_stalls_on_a_20mb_message_or_a_huge_import(server, tmp_path):
    alice, bob = client(server, "alice"), client(server, "bob")
    job = long_reply(alice)
    gap, err = _max_gap_during(
        job,
        lambda: refused(lambda: bob.predict("y" * (20 * 2**20), *sampling(4), api_name="/send")),
    )
    print(f"max gap during 20 MB message: {gap:.3f} s")
    assert "message is too long" in err
    assert gap < 2.0
    # 100k messages, compact enough to pass the byte limit: parsed (off the loop), then refused
    export = {
        "format": "llm-chat-conversation",
        "version": 1,
        "conversation": {"title": "huge"},
        "messages": [
            {"id": i, "parent_id": i - 1 if i else None, "role": "user", "content": "m"}
            for i in range(100_000)
        ],
    }
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(export))
    convs = count(server, "conversations")
    gap, err = _max_gap_during(
        job, lambda: refused(lambda: bob.predict(handle_file(str(path)), api_name="/import_json"))
    )
    print(f"max gap during {path.stat().st_size / 2**20:.1f} MB import: {gap:.3f} s")
    assert "100,000 messages" in err
    assert gap < 2.0
    assert count(server, "conversations") == convs
    job.cancel()
    alice.predict(api_name="/stop")
    for c in (alice, bob):
        c.close()


def test_a_conversation_deleted_mid_reply_is_reported_in_plain_words(server):
    alice = client(server, "alice")
    job = long_reply(alice, "Tell me everything about the history of bridges, at length.")
    conv = next(conversation_id(o) for o in job.outputs() if conversation_id(o))
    other = Storage(str(server.db))  # another process's view of the same history
    other.delete_conversation(conv)
    out = job.result(timeout=180)
    text = reply_text(out)
    assert "was deleted" in text and "could not be saved" in text
    assert "[" not in text and "not found" not in text  # no raw storage detail
    assert read_db(server.db, "SELECT id FROM messages WHERE conversation_id = ?", (conv,)) == []
    alice.predict(api_name="/close_tab")
    alice.close()


def test_the_cache_oracle_gives_bob_the_same_count_for_right_and_wrong_guesses(server):
    secret = "My locker code is 4711 ALPHA ZULU. Please remember it and confirm with one word."
    wrong = "My locker code is 9038 KILO MIKE. Please remember it and confirm with one word."
    alice = client(server, "alice")
    alice.predict(secret, *sampling(max_tokens=1), api_name="/send")

    def cached(user, text):
        # each guess from a different user: a user's own earlier probe is legitimately cached for
        # them, so probing twice as one user would measure their own history, not alice's
        c = client(server, user)
        out = c.predict(text, *sampling(max_tokens=1), api_name="/send")
        conv = conversation_id(out)
        c.predict(api_name="/close_tab")
        c.close()
        return read_db(
            server.db,
            "SELECT s.cached_tokens AS c FROM reply_stats s JOIN messages m ON m.id = "
            "s.message_id WHERE m.conversation_id = ?",
            (conv,),
        )[0]["c"]

    right = cached("bob", secret)
    wrong_count = cached("carol", wrong)
    assert right == wrong_count
    assert right > 0  # the shared system prompt still hits
    alice.predict(api_name="/close_tab")
    alice.close()


def test_gradios_own_cancel_route_refuses_another_users_session_hash(server):
    """Stop's cancels= goes to Gradio's /gradio_api/cancel, which runs none of our handlers."""
    alice, bob = client(server, "alice"), client(server, "bob")
    job = long_reply(alice)
    status, _ = post(
        server,
        "gradio_api/cancel",
        bob,
        {
            "session_hash": alice.session_hash,
            "fn_index": alice._infer_fn_index("/send", None),
            "event_id": "x",
        },
    )
    assert status == 403
    job.result(timeout=180)
    conv = next(conversation_id(o) for o in job.outputs() if conversation_id(o))
    assert read_db(
        server.db,
        "SELECT status FROM messages WHERE conversation_id = ? AND role = 'assistant'",
        (conv,),
    ) == [{"status": "complete"}]
    alice.predict(api_name="/close_tab")
    alice.close()
    bob.close()


def get(server, path, as_client=None):
    """GET with `as_client`'s login cookie (or none); (status, headers, body)."""
    import urllib.error
    import urllib.request

    headers = {}
    if as_client is not None:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in as_client.cookies.items())
    req = urllib.request.Request(server.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_an_export_downloads_for_its_owner_only(server, tmp_path):
    """#12.12: the export link is served by the app to its owner; not through Gradio's file cache,
    which any logged-in user with the URL could read."""
    import re

    alice, bob = client(server, "alice"), client(server, "bob")
    alice.predict("My export secret is tangerine-42.", *sampling(max_tokens=4), api_name="/send")
    html = alice.predict(api_name="/export_json")
    assert "gradio_api/file" not in html
    href = re.search(r'href="([^"]+)"', html).group(1)
    assert href.startswith("exports/")
    code, headers, body = get(server, href, alice)
    assert code == 200 and "tangerine-42" in body.decode()
    assert "attachment" in headers["content-disposition"] and "no-store" in headers["cache-control"]
    for who in (bob, None):  # another login, or none: nothing, and no hint
        code, _, body = get(server, href, who)
        assert code in (401, 403, 404) and b"tangerine" not in body
    token = href.split("/")[1]
    assert get(server, f"exports/{token}/other-name.json", alice)[0] == 404
    # the file round-trips: alice imports what she downloaded
    path = tmp_path / "export.json"
    path.write_bytes(get(server, href, alice)[2])
    imported = alice.predict(handle_file(str(path)), api_name="/import_json")
    assert imported[2]["value"]
    for c in (alice, bob):
        c.close()
