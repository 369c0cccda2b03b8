"""/v1 as the real app mounts it: next to the Gradio page and /metrics in build_app, keys and origins
from app.py's flags, and a real `python app.py --api-key` process answering the `openai` client."""

from __future__ import annotations

import urllib.error
import time
import urllib.request

import openai
import pytest

from engine import SamplingParams
from tests.api.conftest import LiveServer, wait_idle


def get(url: str, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def _wait_for_pins(llm, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while (
        not llm.pins() and time.time() < deadline
    ):  # build_app pins the shared prompt in the background
        time.sleep(0.2)


def _unpin_all(llm) -> None:
    for pin in llm.pins():  # the session's engine is shared with the other API tests
        llm.unpin(pin.name)


@pytest.fixture(scope="module")
def full_app(llm, tmp_path_factory):
    from storage import Storage
    from server import build_app

    st = Storage(tmp_path_factory.mktemp("db") / "chat.db")
    app, _ = build_app(
        llm, st, api_options=dict(api_keys=["sk-app"], allowed_origins=["http://ok.example"])
    )
    _wait_for_pins(llm)
    srv = LiveServer(app)
    yield srv
    srv.stop()
    _unpin_all(llm)
    st.close()


def test_build_app_serves_v1_next_to_the_page_and_metrics(full_app, model_id, llm):
    assert get(full_app.url)[0] == 200  # the Gradio page still at /
    assert get(full_app.url + "v1/models")[0] == 401  # keys from api_options
    c = openai.OpenAI(base_url=full_app.url + "v1", api_key="sk-app", max_retries=0)
    hi = [{"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=model_id, max_tokens=3, temperature=0, messages=hi)
    ref = llm.chat(hi, SamplingParams(temperature=0.0, max_tokens=3))[0].outputs[0]
    assert r.choices[0].message.content == ref.text and r.usage.completion_tokens == len(
        ref.token_ids
    )
    code, text, _ = get(full_app.url + "metrics")
    assert code == 200 and "vllm:kv_cache_usage_perc" in text
    assert 'paged_chat_api_requests_total{endpoint="chat_completions",status="200"} 1' in text
    assert 'paged_chat_api_requests_total{endpoint="models",status="401"} 1' in text
    st = wait_idle(llm)
    assert (
        st["pinned_blocks"] > 0 and st["used_blocks"] == st["pinned_blocks"]
    )  # only the app's pin


def test_gradio_cors_does_not_leak_onto_v1(full_app):
    # a page of another origin is refused before the key is looked at (routes/security/cross_site.py, #29.6)
    code, _, h = get(
        full_app.url + "v1/models",
        {"Origin": "http://evil.example", "Authorization": "Bearer sk-app"},
    )
    assert code == 403 and h.get("access-control-allow-origin") is None
    code, _, h = get(
        full_app.url + "v1/models",
        {"Origin": "http://ok.example", "Authorization": "Bearer sk-app"},
    )
    assert code == 200 and h.get("access-control-allow-origin") == "http://ok.example"


def test_ui_login_without_api_key_closes_the_api(llm, tmp_path):
    from storage import Storage
    from server import build_app

    st = Storage(tmp_path / "chat.db")
    app, _ = build_app(llm, st, auth=[("ann", "secret-pw")])
    srv = LiveServer(app)
    try:
        code, body, _ = get(srv.url + "v1/models", {"Authorization": "Bearer ann:secret-pw"})
        assert code == 401 and "--api-key" in body
    finally:
        srv.stop()
        st.close()


def test_the_idle_page_queue_polls_at_most_every_10_ms_and_a_page_holds_no_heartbeat(llm, tmp_path):
    """Gradio's queue looks for work every 1 ms by default (~8% of a core with nobody connected);
    the server slows both of its polls (server/assembly.py). The page holds no heartbeat stream (a
    gr.State or an unload event would add one per tab: ui/chat/tab_goodbye.py); a page's goodbye
    closes its tab only with that tab's secret."""
    from starlette.testclient import TestClient
    from storage import Storage
    from server import assembly
    from ui.chat import tab_goodbye

    st = Storage(tmp_path / "chat.db")
    try:
        app, demo = assembly.build_app(llm, st)
        assert demo._queue.sleep_when_free >= assembly.QUEUE_POLL_S == 0.01
        assert demo._queue.progress_update_sleep_when_free >= assembly.PROGRESS_POLL_S
        assert demo.get_config_file()["connect_heartbeat"] is False
        tabs = demo.chat_context.tabs
        tab = tabs.get("s-goodbye")
        tabs.open(tab, "conv-x")
        client = TestClient(app, base_url="http://127.0.0.1")
        for body in (b"s-goodbye wrong", b"s-goodbye", b"", b"x" * 5000):
            assert client.post("/" + tab_goodbye.GOODBYE_PATH, content=body).status_code == 204
        assert tabs.open_conversations() == {"conv-x": 1}
        r = client.post("/" + tab_goodbye.GOODBYE_PATH, content=f"s-goodbye {tab.goodbye}".encode())
        assert r.status_code == 204 and tabs.open_conversations() == {}
    finally:
        _wait_for_pins(llm)
        _unpin_all(llm)
        st.close()


def test_app_flags_parse_keys_and_origins(monkeypatch):
    import app
    from routes.openai.keys import keys_from_env

    args = app.parse_args(
        ["--api-key", "a", "--api-key", "b", "--allowed-origin", "http://x.example"]
    )
    assert args.api_key == ["a", "b"] and args.allowed_origin == ["http://x.example"]
    assert app.parse_args([]).api_key is None
    assert keys_from_env({"PAGED_CHAT_API_KEYS": " k1, ,k2 "}) == ["k1", "k2"]


@pytest.mark.slow
def test_python_app_serves_the_api_with_a_key(tmp_path):
    from tests.e2e.conftest import SMALL, AppServer

    srv = AppServer(
        tmp_path / "chat.db",
        [*SMALL, "--api-key", "sk-proc"],
        tmp_path / "app.log",
        env={"PAGED_CHAT_API_KEYS": "sk-env"},
    ).wait_ready()
    try:
        for key in ("sk-proc", "sk-env"):
            c = openai.OpenAI(base_url=srv.url + "v1", api_key=key, max_retries=0, timeout=120)
            model = c.models.list().data[0].id
            text = "".join(
                ch.choices[0].delta.content or ""
                for ch in c.chat.completions.create(
                    model=model,
                    max_tokens=8,
                    stream=True,
                    messages=[{"role": "user", "content": "Hi"}],
                )
                if ch.choices
            )
            assert text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "v1", api_key="nope", max_retries=0).models.list()
    finally:
        assert srv.stop() == 0


def test_app_warns_when_the_api_is_open_beyond_this_machine(capsys, monkeypatch):
    """The warning comes before the model loads; a model path that does not exist ends main() there."""
    import signal

    import app

    monkeypatch.delenv("PAGED_CHAT_API_KEYS", raising=False)
    monkeypatch.setattr(
        signal, "signal", lambda *a: None
    )  # main() must not rewire pytest's handlers
    with pytest.raises(BaseException):
        app.main(["--host", "0.0.0.0", "--model", "/nonexistent/model.gguf"])
    assert "without --api-key" in capsys.readouterr().err
    with pytest.raises(BaseException):
        app.main(
            [
                "--host",
                "0.0.0.0",
                "--api-key",
                "k",
                "--auth",
                "a:b",
                "--model",
                "/nonexistent/model.gguf",
            ]
        )
    assert "without --api-key" not in capsys.readouterr().err
