"""--share serves this app (with all its guards) through a tunnel: the link's host name is allowed
by the Host guard once the tunnel is up, and no other name is (routes/share.py). The tunnel itself
(Gradio's share server) needs internet, so it is replaced by a function returning a link."""

import fastapi
import gradio as gr
from fastapi.testclient import TestClient

from routes.security.host_guard import install_security
from routes.share import open_share_link


def _app(share_hosts):
    app = fastapi.FastAPI()

    @app.get("/config-like")
    def secret():
        return {"ok": True}

    with gr.Blocks() as demo:
        gr.Markdown("hello")
    app = gr.mount_gradio_app(app, demo, path="/", ssr_mode=False)
    install_security(app, "127.0.0.1", (), share_hosts=share_hosts)
    return app


def test_the_share_links_host_is_served_once_the_tunnel_is_up_and_no_other():
    share_hosts: set = set()
    calls = []

    def tunnel(host, port):
        calls.append((host, port))
        return "https://0123abcd.gradio.live"

    with TestClient(_app(share_hosts), base_url="http://127.0.0.1:7860") as c:
        assert c.get("/config-like", headers={"host": "0123abcd.gradio.live"}).status_code == 421
        url = open_share_link("127.0.0.1", 7860, share_hosts, tunnel=tunnel)
        assert url == "https://0123abcd.gradio.live" and calls == [("127.0.0.1", 7860)]
        assert c.get("/config-like", headers={"host": "0123abcd.gradio.live"}).status_code == 200
        assert (
            c.get("/config-like", headers={"host": "0123ABCD.gradio.live:443"}).status_code == 200
        )
        for other in ("evil.example", "other.gradio.live", "gradio.live"):
            assert c.get("/config-like", headers={"host": other}).status_code == 421
        assert c.get("/config-like", headers={"host": "127.0.0.1:7860"}).status_code == 200


def test_a_tunnel_without_a_host_allows_nothing():
    share_hosts: set = set()
    try:
        open_share_link("127.0.0.1", 7860, share_hosts, tunnel=lambda h, p: "not a url")
    except RuntimeError as e:
        assert "no usable link" in str(e)
    else:
        raise AssertionError("a link without a host name was accepted")
    assert share_hosts == set()
