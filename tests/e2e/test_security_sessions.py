"""Issue #29 items 2 and 5 and issue 48 items 2 and 6 against a real `python app.py --auth alice
--auth bob --admin alice --api-key ... --metrics-token ...` process.

29.2 alice's beam-searched text cannot be confirmed by an API key holder through `cached_tokens`
   (right guess 80/92 cached, wrong 32/92 before): right and wrong guesses now get the same count.
29.5 bob cannot read (and so break) alice's live reply through her session hash on Gradio's event
   stream `/gradio_api/queue/data` nor beat her heartbeat; her reply completes.
48.2 key alpha cannot confirm key beta's text through `cached_tokens` (one salt per key; before,
   every key was `api:default`: right guess 80 cached, wrong 32).
48.6 /metrics: aggregates for anyone, the per-tenant lines only for an --admin login or the
   --metrics-token (before, anyone read every tenant's token counts without a login)."""

import http.client

import openai
import pytest
from gradio_client import Client

from tests.e2e.conftest import AppServer, conversation_id, read_db, sampling, streaming_text
from tests.e2e.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
USERS = {"alice": "wonderland", "bob": "builder"}
KEY = "sk-issue-29"
SECRET = "My locker code is 4711 ALPHA ZULU. Please remember it and confirm with one word."
# probes that share nothing with each other past the system prompt: the API caller's own earlier
# probes are legitimately cached for it, so a shared start would measure its own history
WRONG = "Our locker code was 9038 KILO MIKE. Please remember it and confirm with one word."
UNRELATED = "How do I make a good cup of tea?"
METRICS_TOKEN = "mt-issue-48"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sess29")
    args = [
        "--num-blocks",
        "512",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        "4",
        "--api-key",
        KEY,
        "--api-key",
        "alpha:sk-alpha",
        "--api-key",
        "beta:sk-beta",
        "--admin",
        "alice",
        "--metrics-token",
        METRICS_TOKEN,
    ]
    for u, p in USERS.items():
        args += ["--auth", f"{u}:{p}"]
    s = AppServer(tmp / "chat.db", args, tmp / "app.log")
    try:
        yield s.wait_ready()
    finally:
        s.kill()


def client(server, user):
    return Client(server.url, auth=(user, USERS[user]), verbose=False)


def test_an_api_key_holder_cannot_confirm_alices_beam_searched_text(server):
    alice = client(server, "alice")
    out = alice.predict(SECRET, *sampling(max_tokens=4), "beam search (width 2)", api_name="/send")
    conv = conversation_id(out)
    system = read_db(
        server.db,
        "SELECT p.text FROM conversations c JOIN system_prompts p "
        "ON p.id = c.system_prompt_id WHERE c.id = ?",
        (conv,),
    )[0]["text"]
    beams = read_db(
        server.db,
        "SELECT COUNT(*) AS n FROM messages WHERE conversation_id = ? AND role = 'assistant'",
        (conv,),
    )[0]["n"]
    assert beams == 2  # it really was a beam search
    api = openai.OpenAI(base_url=server.url + "v1", api_key=KEY, max_retries=0, timeout=120)
    model = api.models.list().data[0].id

    def cached(text):
        r = api.chat.completions.create(
            model=model,
            max_tokens=1,
            temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": text}],
        )
        return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    cached(UNRELATED)  # warms the API caller's own copy of the template's first user-turn block
    baseline, _ = cached(UNRELATED)  # what the system prompt alone gives
    right, total = cached(SECRET)
    wrong, _ = cached(WRONG)
    assert right == wrong == baseline  # the right guess is not confirmed
    assert 0 < right < total  # the shared system prompt still hits
    alice.predict(api_name="/close_tab")
    alice.close()


def _get(server, path, as_client):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    cookie = "; ".join(f"{k}={v}" for k, v in as_client.cookies.items())
    conn.request("GET", path, headers={"Cookie": cookie, "Accept": "text/event-stream"})
    r = conn.getresponse()
    status = r.status
    conn.close()  # never read a stream that would be someone else's events
    return status


def test_another_users_session_hash_cannot_read_her_stream(server):
    alice, bob = client(server, "alice"), client(server, "bob")
    job = alice.submit(
        "Write a long story about a lighthouse keeper and the sea.",
        *sampling(max_tokens=200),
        api_name="/send",
    )
    wait_until(lambda: streaming_text(job), timeout=120, what="streaming")
    h = alice.session_hash
    assert _get(server, f"/gradio_api/queue/data?session_hash={h}", bob) == 403
    assert _get(server, f"/gradio_api/heartbeat/{h}", bob) == 403
    out = job.result(timeout=240)
    conv = next(conversation_id(o) for o in job.outputs() if conversation_id(o))
    assert read_db(
        server.db,
        "SELECT status FROM messages WHERE conversation_id = ? AND role = 'assistant'",
        (conv,),
    ) == [{"status": "complete"}]
    assert out is not None
    # bob's own session hash streams for bob as always
    assert bob.predict("Hi", *sampling(max_tokens=2), api_name="/send") is not None
    for c in (alice, bob):
        c.predict(api_name="/close_tab")
        c.close()


def _api(server, key):
    return openai.OpenAI(base_url=server.url + "v1", api_key=key, max_retries=0, timeout=120)


def test_key_alpha_cannot_confirm_key_betas_text_through_cached_tokens(server):
    system = "You are a concise assistant for a shipping company."
    model = _api(server, "sk-alpha").models.list().data[0].id

    def cached(key, text):
        r = _api(server, key).chat.completions.create(
            model=model,
            max_tokens=1,
            temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": text}],
        )
        return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    cached("sk-beta", SECRET)  # beta's message is in the prefix cache
    cached("sk-alpha", UNRELATED)  # alpha's own first user-turn block
    right, total = cached("sk-alpha", SECRET)
    wrong, _ = cached("sk-alpha", WRONG)
    fresh, _ = cached("sk-alpha", "Which port handles the most containers in Europe?")
    assert right == wrong == fresh, (right, wrong, fresh)
    assert 0 < right < total  # the system prompt is shared on purpose


def _metrics(server, headers=None, as_client=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = dict(headers or {})
    if as_client is not None:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in as_client.cookies.items())
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    body = r.read().decode()
    conn.close()
    assert r.status == 200
    return body


def test_metrics_show_per_tenant_lines_only_to_an_admin_or_the_metrics_token(server):
    api = _api(server, "sk-alpha")
    api.completions.create(model=api.models.list().data[0].id, prompt="Hi", max_tokens=1)
    anonymous = _metrics(server)
    assert "vllm:num_requests_running" in anonymous and "paged_chat_api_requests_total" in anonymous
    assert "paged_chat_tenant_" not in anonymous and "alpha" not in anonymous
    assert "paged_chat_tenant_" not in _metrics(server, {"Authorization": "Bearer wrong-token"})
    assert 'tenant="alpha"' in _metrics(server, {"Authorization": f"Bearer {METRICS_TOKEN}"})
    alice, bob = client(server, "alice"), client(server, "bob")
    try:
        assert 'tenant="alpha"' in _metrics(server, as_client=alice)  # --admin alice
        assert "paged_chat_tenant_" not in _metrics(server, as_client=bob)
    finally:
        alice.close()
        bob.close()
