"""Issue #12 items 8 and 13 (docs): the DNS-rebinding Host check and the removed API docs.

Built the way ui/layout.py builds the real app: a FastAPI app with our routes, Gradio mounted at
"/", then install_security. Requests go through the whole ASGI stack (Starlette's TestClient).
"""

import fastapi
import gradio as gr
import pytest
from fastapi.testclient import TestClient

from routes.security.host_guard import (
    HostGuard,
    install_security,
    is_loopback_host,
    split_host_header,
)


def _app(bind_host="127.0.0.1", allowed=(), auth=None):
    app = fastapi.FastAPI()

    @app.get("/config-like")
    def secret():
        return {"conversations": ["alice-secret"]}

    with gr.Blocks() as demo:
        gr.Markdown("hello")
    app = gr.mount_gradio_app(app, demo, path="/", auth=auth, ssr_mode=False)
    install_security(app, bind_host, allowed, auth=auth)
    return app


@pytest.fixture(scope="module")
def local_client():
    with TestClient(_app(allowed=["chat.lan"]), base_url="http://127.0.0.1:7860") as c:
        yield c


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:7860",
        "localhost:7860",
        "localhost",
        "[::1]:7860",
        "127.0.0.2",
        "LOCALHOST:7860",
        "app.localhost:7860",
        "localhost.",
        "chat.lan:7860",
        "CHAT.LAN",
    ],
)
def test_loopback_and_named_hosts_are_served(local_client, host):
    r = local_client.get("/config-like", headers={"host": host})
    assert r.status_code == 200 and r.json() == {"conversations": ["alice-secret"]}


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:7860",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
        "192.168.1.5:7860",
        "0.0.0.0",
        "[::ffff:7f00:1]x",
        "user@127.0.0.1",
        "::1",
        "",
        "chat.lan.evil",
    ],
)
def test_other_hosts_are_refused_before_any_route(local_client, host):
    for path in ("/config-like", "/", "/config", "/gradio_api/info"):
        r = local_client.get(path, headers={"host": host})
        assert r.status_code == 421, (host, path, r.status_code)
        assert "alice-secret" not in r.text


def test_websocket_with_a_foreign_host_is_closed(local_client):
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect):
        with local_client.websocket_connect("/anything", headers={"host": "evil.example"}):
            pass


def test_non_loopback_bind_checks_only_when_names_are_given():
    with TestClient(_app(bind_host="0.0.0.0"), base_url="http://192.168.1.5") as c:
        assert c.get("/config-like", headers={"host": "whatever.example"}).status_code == 200
    with TestClient(_app(bind_host="192.168.1.5", allowed=["chat.lan"]), base_url="http://x") as c:
        assert c.get("/config-like", headers={"host": "chat.lan"}).status_code == 200
        assert c.get("/config-like", headers={"host": "192.168.1.5:7860"}).status_code == 200
        assert c.get("/config-like", headers={"host": "localhost"}).status_code == 200
        assert c.get("/config-like", headers={"host": "evil.example"}).status_code == 421


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_api_docs_are_gone_and_nothing_answers_500(local_client, path):
    r = local_client.get(path, headers={"host": "127.0.0.1:7860"})
    assert r.status_code == 404, (path, r.status_code)


def test_host_header_parsing():
    assert split_host_header("Example.COM:8080") == "example.com"
    assert split_host_header("[::1]:7860") == "::1"
    assert split_host_header("[::1]") == "::1"
    assert split_host_header("::1") is None
    assert split_host_header("a b") is None and split_host_header("h:port") is None
    assert (
        is_loopback_host("127.9.9.9")
        and is_loopback_host("::1")
        and not is_loopback_host("10.0.0.1")
    )
    assert not HostGuard(None).host_allowed(None)
