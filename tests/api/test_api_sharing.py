"""The API on a shared engine: 32 concurrent streaming clients share a system prompt's blocks, API
chats hit the blocks of a browser chat's system prompt, API requests are labelled in /api/kv and
/metrics, and a client that hangs up (streaming or not) has its request aborted and blocks freed."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import httpx

from tests.api.conftest import wait_idle

SYSTEM = (
    "You are the support assistant of a small bakery in Lyon. Answer politely, in one or two short "
    "sentences, and always mention that fresh bread is baked every morning at six o'clock."
)


def kv(server) -> dict:
    with urllib.request.urlopen(server.url + "api/kv?fresh=1", timeout=30) as r:
        return json.load(r)


def metrics(server) -> str:
    with urllib.request.urlopen(server.url + "metrics", timeout=30) as r:
        return r.read().decode()


def system_tokens(tokenizer, text: str) -> int:
    rendered = tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=False)
    return len(tokenizer.encode(rendered, add_special_tokens=False))


def api_seqs(snap) -> list[dict]:
    return [s for s in snap["sequences"] if str(s.get("request_id") or "").startswith("api-")]


def in_flight_drains(server, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while "paged_chat_api_sequences_in_flight 0\n" not in metrics(server):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_32_concurrent_streams_share_the_system_prompt(aclient, server, model_id, llm, tokenizer):
    sys_tokens = system_tokens(tokenizer, SYSTEM)
    seen_shared = []

    async def one(i):
        stream = await aclient.chat.completions.create(
            model=model_id,
            temperature=0.7,
            seed=i,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question {i}: when?"},
            ],
        )
        text, usage = "", None
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
            if ch.usage:
                usage = ch.usage
        return text, usage

    async def watch():
        for _ in range(40):
            snap = await asyncio.to_thread(kv, server)
            if len(api_seqs(snap)) > 1:
                seen_shared.append(snap)
                return
            await asyncio.sleep(0.05)

    async def main():
        first = await one(0)  # fills the prefix cache
        rest = asyncio.gather(*(one(i) for i in range(1, 32)))
        await watch()
        return [first, *await rest]

    results = asyncio.run(main())
    cached = [u.prompt_tokens_details.cached_tokens for _, u in results]
    assert cached[0] == 0
    assert all(c > 0 for c in cached[1:]), cached
    # every later client reused at least the system prompt's full blocks
    assert min(cached[1:]) >= (sys_tokens // 16) * 16 > 0
    assert all(text for text, _ in results)
    assert seen_shared, "never saw two API requests running at once"
    snap = seen_shared[0]
    assert all(s["request_id"].startswith("api-chatcmpl-") for s in api_seqs(snap))
    assert snap["stats"]["shared_blocks"] > 0
    m = metrics(server)
    line = next(
        x
        for x in m.splitlines()
        if x.startswith('paged_chat_api_requests_total{endpoint="chat_completions",status="200"}')
    )
    assert int(line.split()[-1]) >= 32
    assert wait_idle(llm)["used_blocks"] == 0


def test_api_chat_hits_the_blocks_of_a_browser_chat_system_prompt(client, model_id, llm, tokenizer):
    """The browser's chat path (LLM.submit_chat with a session) and the API render the same tokens."""
    from engine import SamplingParams

    other = SYSTEM.replace("Lyon", "Nantes")  # not in the cache from earlier tests
    sys_tokens = system_tokens(tokenizer, other)
    browser = llm.submit_chat(
        [{"role": "system", "content": other}, {"role": "user", "content": "Hello"}],
        SamplingParams(temperature=0.0, max_tokens=4),
        session_id="browser-conv",
    )
    list(browser)
    try:
        r = client.chat.completions.create(
            model=model_id,
            max_tokens=4,
            messages=[
                {"role": "system", "content": other},
                {"role": "user", "content": "Are you open on Sunday?"},
            ],
        )
        assert r.usage.prompt_tokens_details.cached_tokens >= (sys_tokens // 16) * 16 > 0
    finally:
        llm.end_session("browser-conv")
    assert wait_idle(llm)["used_blocks"] == 0


def test_stream_disconnect_aborts_and_frees_blocks(server, model_id, llm):
    before = llm.stats()["generated_tokens_total"]
    body = {
        "model": model_id,
        "prompt": "Count: 1, 2, 3,",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert all(x.startswith("data: ") or x == "" for x in got)
            running = api_seqs(kv(server))
            assert running and running[0]["request_id"].startswith("api-cmpl-")
            assert kv(server)["stats"]["used_blocks"] > 0
    # connection closed mid-stream: the request is aborted and every block returns
    deadline = time.time() + 30
    while api_seqs(kv(server)) and time.time() < deadline:
        time.sleep(0.05)
    snap = kv(server)
    assert api_seqs(snap) == [] and snap["stats"]["used_blocks"] == 0
    assert llm.stats()["generated_tokens_total"] - before < 900
    assert in_flight_drains(server)  # its admission slot is back


def test_non_streaming_disconnect_aborts_and_frees_blocks(server, model_id, llm):
    before = llm.stats()["generated_tokens_total"]
    body = {"model": model_id, "prompt": "Count: 1, 2, 3,", "max_tokens": 900, "ignore_eos": True}
    try:
        httpx.post(server.url + "v1/completions", json=body, timeout=2.0)
        raise AssertionError("900 tokens cannot have been generated within the timeout")
    except httpx.ReadTimeout:
        pass  # the client gives up and hangs up
    deadline = time.time() + 30
    while api_seqs(kv(server)) and time.time() < deadline:
        time.sleep(0.05)
    snap = kv(server)
    assert api_seqs(snap) == [] and snap["stats"]["used_blocks"] == 0
    assert llm.stats()["generated_tokens_total"] - before < 900
    assert in_flight_drains(server)  # its admission slot is back
    assert 'paged_chat_api_requests_total{endpoint="completions",status="499"}' in metrics(server)


def test_one_key_cannot_confirm_another_keys_prompt_through_cached_tokens(keyed_server, model_id):
    """Issue 48.2: every key is its own principal (`api:NAME` cache salt, engine/kv/salt_rule.py)
    once several keys are configured, so the second key's message is never a prefix-cache hit for
    the first: a right guess, a wrong guess and an unrelated prompt get the same `cached_tokens`
    (the shared system prompt's). Before, all keys shared one salt: the right guess hit more."""
    import openai

    from tests.api.conftest import API_KEY

    secret = "The vault code of the Lyon bakery is 5521 TANGO ECHO. Confirm it with one word."
    wrong = "Our shop alarm code was 9038 KILO MIKE, written on the fridge. Confirm it in a word."
    unrelated = "How long should bread dough rest before baking?"

    def ask(key, text):
        c = openai.OpenAI(base_url=keyed_server.url + "v1", api_key=key, max_retries=0, timeout=120)
        r = c.chat.completions.create(
            model=model_id,
            max_tokens=1,
            temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        )
        return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    ask("sk-second", secret)  # beta's message is now in the prefix cache
    ask(API_KEY, unrelated)  # alpha's own copy of the first user-turn block
    right, total = ask(API_KEY, secret)
    wrong_hit, _ = ask(API_KEY, wrong)
    baseline, _ = ask(API_KEY, "Which flour gives a baguette its crisp crust, and why?")
    assert right == wrong_hit == baseline, (right, wrong_hit, baseline)
    assert 0 < right < total  # the system prompt is still shared on purpose
    assert ask("sk-second", secret)[0] > right  # beta's own repeat does hit its own blocks
