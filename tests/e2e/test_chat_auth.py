"""With --auth, each user sees only their own conversations; another user's id is refused."""

import urllib.error
import urllib.request

import pytest
from gradio_client import Client

pytestmark = pytest.mark.slow


def test_each_user_sees_only_their_own_conversations(launch, chat_api):
    api = chat_api
    server = launch(
        args=[
            "--num-blocks",
            "256",
            "--max-model-len",
            "512",
            "--auth",
            "alice:wonderland",
            "--auth",
            "bob:builder",
        ]
    )
    with pytest.raises(urllib.error.HTTPError):  # the API needs a login
        urllib.request.urlopen(server.url + "gradio_api/info", timeout=10)
    with pytest.raises(Exception):
        Client(server.url, auth=("alice", "wrong"), verbose=False)

    alice = Client(server.url, auth=("alice", "wonderland"), verbose=False)
    out = alice.predict(
        "Alice's secret recipe question", *api.sampling(max_tokens=4), api_name="/send"
    )
    conv = api.conversation_id(out)
    assert api.read_db(server.db, "SELECT owner FROM conversations WHERE id = ?", (conv,)) == [
        {"owner": "alice"}
    ]

    bob = Client(server.url, auth=("bob", "builder"), verbose=False)
    assert bob.predict("", api_name="/search")["choices"] == []  # not in bob's list
    assert bob.predict("secret", api_name="/search")["choices"] == []  # nor found by search
    opened = bob.predict(conv, api_name="/open_conversation")  # asking for it by id
    assert opened[0] == [] and opened[2]["value"] is None  # refused: nothing shown
    assert bob.predict(api_name="/export_json") is None
    out = bob.predict("Bob's own question", *api.sampling(max_tokens=4), api_name="/send")
    bob_conv = api.conversation_id(out)
    assert bob_conv != conv
    assert [c[1] for c in bob.predict("", api_name="/search")["choices"]] == [bob_conv]
    assert [c[1] for c in alice.predict("", api_name="/search")["choices"]] == [conv]
    # Alice's messages are untouched by Bob's attempt.
    assert (
        len(api.read_db(server.db, "SELECT id FROM messages WHERE conversation_id = ?", (conv,)))
        == 2
    )
    for c in (alice, bob):
        c.predict(api_name="/close_tab")
        c.close()
