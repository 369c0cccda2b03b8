"""Every error path returns OpenAI's error JSON with the right status, so the official client raises
the matching exception: 400 bad parameters, 401 keys, 404 model / endpoint, 429 queue bound, 503
engine gone. A rejected call leaves the engine exactly as it was (no block held, nothing waiting)."""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request

import openai
import pytest

from engine import SamplingParams
from tests.api.conftest import API_KEY, LiveServer, build_server_app, wait_idle
from tests.api.helpers import assert_openai_error, raw

MSG = [{"role": "user", "content": "Hi"}]
HAS_PENALTIES = "presence_penalty" in {f.name for f in dataclasses.fields(SamplingParams)}


@pytest.mark.parametrize(
    "extra,param_word",
    [
        (dict(temperature=2.5), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(n=0), "n"),
        (dict(n=100), "n"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=5000), "context length"),
        (dict(max_completion_tokens=-1), "max_completion_tokens"),
        (dict(stop=[str(i) for i in range(40)]), "stop"),
        (dict(top_logprobs=3), "top_logprobs"),
        (dict(top_logprobs=25, logprobs=True), "top_logprobs"),
        (dict(tools=[{"type": "function", "function": {"name": "not a name!"}}]), "tools"),
        (
            dict(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tool_choice",
        ),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(logit_bias={"fifty": 5}), "logit_bias"),
        (dict(logit_bias={"50": 500}), "logit_bias"),
        (dict(logit_bias={"99999999": 5}), "logit_bias"),
        (dict(response_format={"type": "yaml"}), "response_format"),
        (
            dict(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "bogus"}},
                }
            ),
            "not valid",
        ),
        (
            dict(response_format={"type": "json_object"}, structured_outputs={"regex": "a+"}),
            "one output constraint",
        ),
        (dict(structured_outputs={"regex": "([a"}), "not valid"),
        (dict(continue_final_message=True), "continue_final_message"),
        (dict(stream_options={"include_usage": True}), "stream_options"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(top_k=0), "top_k"),
    ],
)
def test_invalid_chat_parameters_are_400(server, model_id, llm, extra, param_word):
    before = llm.stats()
    err = assert_openai_error(
        raw(server.url + "v1/chat/completions", {"model": model_id, "messages": MSG, **extra}),
        400,
        param_word,
    )
    assert err["type"] == "invalid_request_error"
    after = llm.stats()
    assert (after["running"], after["waiting"]) == (0, 0)
    assert after["generated_tokens_total"] == before["generated_tokens_total"]


@pytest.mark.parametrize(
    "body,word",
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({}, "messages"),
    ],
)
def test_malformed_messages_are_400(server, model_id, body, word):
    assert_openai_error(
        raw(server.url + "v1/chat/completions", {"model": model_id, **body}), 400, word
    )


def test_invalid_json_body_is_400(server):
    assert_openai_error(raw(server.url + "v1/chat/completions", b"{not json"), 400, "JSON")


@pytest.mark.parametrize(
    "prompt,word",
    [
        ([], "prompt"),
        ([10**7], "vocabulary"),
        ("x " * 2000, "max_model_len"),
        ("", "empty"),
        ([[19556], [10**7]], "vocabulary"),
    ],
)
def test_bad_completion_prompts_are_400(server, model_id, llm, prompt, word):
    before = llm.stats()["generated_tokens_total"]
    assert_openai_error(
        raw(server.url + "v1/completions", {"model": model_id, "prompt": prompt, "max_tokens": 4}),
        400,
        word,
    )
    assert (
        llm.stats()["generated_tokens_total"] == before
    )  # no prompt of the call ran, not even the valid first one


def test_unsupported_completion_fields_are_400(client, model_id):
    for kw in (
        dict(best_of=3),
        dict(suffix="end"),
        dict(max_tokens=0),
        dict(echo=True, stream=True),
    ):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=model_id, prompt="Hi", **{"max_tokens": 2, **kw})


def test_penalties_pass_through_or_are_rejected_clearly(client, model_id):
    call = dict(
        model=model_id, messages=MSG, max_tokens=4, presence_penalty=0.5, frequency_penalty=0.5
    )
    if HAS_PENALTIES:
        assert client.chat.completions.create(**call).choices[0].finish_reason in ("stop", "length")
    else:
        with pytest.raises(openai.BadRequestError, match="presence_penalty is not supported"):
            client.chat.completions.create(**call)
    # zero penalties are OpenAI's defaults: always accepted
    client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=2, presence_penalty=0, frequency_penalty=0
    )


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=MSG)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x")


def test_unknown_endpoint_is_404_in_openai_shape(server):
    assert_openai_error(
        raw(server.url + "v1/embeddings", {"model": "x", "input": "y"}), 404, "unknown endpoint"
    )


def test_keys_missing_or_wrong_are_401_and_right_keys_work(keyed_server, model_id):
    url = keyed_server.url + "v1/chat/completions"
    body = {"model": model_id, "messages": MSG, "max_tokens": 2}
    assert_openai_error(raw(url, body), 401, "missing API key")
    assert_openai_error(
        raw(url, body, {"Authorization": "Bearer sk-wrong"}), 401, "incorrect API key"
    )
    # a bad key is refused before the body is read: even invalid JSON gets 401, not 400
    assert_openai_error(raw(url, b"{", {"Authorization": "Bearer sk-wrong"}), 401)
    with urllib.request.urlopen(keyed_server.url + "metrics") as r:
        assert (
            'paged_chat_api_requests_total{endpoint="chat_completions",status="401"} 3'
            in r.read().decode()
        )
    bad = openai.OpenAI(base_url=keyed_server.url + "v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for key in (API_KEY, "sk-second"):
        good = openai.OpenAI(base_url=keyed_server.url + "v1", api_key=key, max_retries=0)
        assert good.chat.completions.create(model=model_id, messages=MSG, max_tokens=2).choices


def test_wrong_keys_are_throttled_per_address(llm, model_id):
    """Guessing keys at line rate is refused: after 5 wrong keys the address waits (429 +
    Retry-After) before any key is checked again, even the right one; then the right key works
    and clears the address."""
    import time

    srv = LiveServer(build_server_app(llm, api_keys=[API_KEY]))
    try:
        url = srv.url + "v1/models"
        for _ in range(5):
            assert_openai_error(
                raw(url, headers={"Authorization": "Bearer sk-guess"}), 401, "incorrect API key"
            )
        code, err, h = raw(url, headers={"Authorization": f"Bearer {API_KEY}"})
        assert code == 429 and "wrong API key" in err["error"]["message"], (code, err)
        wait = int(h["Retry-After"])
        assert wait >= 1
        time.sleep(wait + 0.2)
        code, models, _ = raw(url, headers={"Authorization": f"Bearer {API_KEY}"})
        assert code == 200 and models["data"][0]["id"] == model_id
        for _ in range(5):  # cleared by the success: 5 more free tries
            assert raw(url, headers={"Authorization": "Bearer sk-guess"})[0] == 401
    finally:
        srv.stop()


def test_login_required_but_no_key_configured_refuses_everything(llm):
    srv = LiveServer(build_server_app(llm, require_key=True))
    try:
        assert_openai_error(
            raw(srv.url + "v1/models", headers={"Authorization": "Bearer anything"}),
            401,
            "--api-key",
        )
    finally:
        srv.stop()


def test_cors_only_for_allowed_origins(server, keyed_server):
    pre = {
        "Origin": "http://good.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    code, _, h = raw(keyed_server.url + "v1/chat/completions", None, pre, method="OPTIONS")
    assert code == 200 and h["access-control-allow-origin"] == "http://good.example"
    evil = dict(pre, Origin="http://evil.example")
    code, _, h = raw(keyed_server.url + "v1/chat/completions", None, evil, method="OPTIONS")
    assert code == 400 and h.get("access-control-allow-origin") is None
    # another site's page is refused outright, even with the right key (#29.6: it counts for nobody)
    code, _, h = raw(
        keyed_server.url + "v1/models",
        None,
        {"Origin": "http://evil.example", "Authorization": f"Bearer {API_KEY}"},
    )
    assert code == 403 and h.get("access-control-allow-origin") is None
    code, _, h = raw(
        keyed_server.url + "v1/models",
        None,
        {"Origin": "http://good.example", "Authorization": f"Bearer {API_KEY}"},
    )
    assert code == 200 and h["access-control-allow-origin"] == "http://good.example"
    # no --allowed-origin: no CORS headers for anyone, and other origins' pages are refused
    code, _, h = raw(server.url + "v1/models", None, {"Origin": "http://good.example"})
    assert code == 403 and h.get("access-control-allow-origin") is None


def test_over_the_queue_bound_is_429_with_retry_after(keyed_server, model_id, llm):
    """keyed_server admits at most 2 API sequences in flight per key: a running n=2 stream fills
    the first key's bound. Its next calls get 429 naming its own bound; the second key is still
    served (issue 48.3: the pre-parse gate counted every key's sequences, so it got 429 too)."""
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {
        "model": model_id,
        "messages": MSG,
        "n": 2,
        "max_tokens": 600,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=keyed_server.url, headers=headers, timeout=120) as http:
        with http.stream("POST", "v1/chat/completions", json=body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # keep it referenced: a collected iterator closes the stream
            next(lines)
            code, err, h = raw(
                keyed_server.url + "v1/chat/completions",
                {"model": model_id, "messages": MSG, "max_tokens": 2},
                headers,
            )
            assert code == 429, (code, err)
            assert err["error"]["type"] == "rate_limit_error" and h["Retry-After"] == "1"
            message = err["error"]["message"]
            assert "your key (api-key-1)" in message and "bound 2 per key" in message
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(
                    base_url=keyed_server.url + "v1", api_key=API_KEY, max_retries=0
                ).completions.create(model=model_id, prompt="x", max_tokens=2)
            other = openai.OpenAI(
                base_url=keyed_server.url + "v1", api_key="sk-second", max_retries=0
            )
            served = other.chat.completions.create(
                model=model_id, messages=MSG, max_tokens=2, extra_body={"ignore_eos": True}
            )
            assert served.usage.completion_tokens == 2
    # the first stream was dropped: its slots and blocks come back, and the API admits again
    assert wait_idle(llm)["used_blocks"] == 0
    code, _, _ = raw(
        keyed_server.url + "v1/chat/completions",
        {"model": model_id, "messages": MSG, "max_tokens": 2},
        headers,
    )
    assert code == 200


def test_engine_shut_down_is_503():
    from engine import ServingLLM

    small = ServingLLM(num_blocks=16, max_model_len=256)
    srv = LiveServer(build_server_app(small))
    try:
        model = raw(srv.url + "v1/models")[1]["data"][0]["id"]
        small.shutdown()
        assert_openai_error(
            raw(srv.url + "v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 2}),
            503,
            "shut down",
        )
    finally:
        srv.stop()
        small.shutdown()
