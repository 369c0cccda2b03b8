"""server/page_head.HeadFirst: the page at / gets the script first in its <head>, with a matching
Content-Length; everything else (other paths, other methods, non-HTML, event streams) is untouched."""

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.testclient import TestClient

from server.page_head import HeadFirst

PAGE = "<!doctype html><html><head><meta charset='utf-8'></head><body>hi</body></html>"
SCRIPT = "<script>window.first = 1;</script>"


def _client() -> TestClient:
    app = FastAPI()
    app.get("/", response_class=HTMLResponse)(lambda: PAGE)
    app.get("/other", response_class=HTMLResponse)(lambda: PAGE)
    app.get("/data")(lambda: JSONResponse({"<head>": 1}))

    def stream():
        yield b"data: <head>\n\n"
        yield b"data: 2\n\n"

    app.get("/stream")(lambda: StreamingResponse(stream(), media_type="text/event-stream"))
    app.add_middleware(HeadFirst, script=SCRIPT, path="/")
    return TestClient(app)


def test_the_page_starts_its_head_with_the_script():
    r = _client().get("/")
    assert r.status_code == 200
    assert r.text == PAGE.replace("<head>", "<head>" + SCRIPT)
    assert int(r.headers["content-length"]) == len(r.content)


def test_everything_else_passes_untouched():
    c = _client()
    assert c.get("/other").text == PAGE
    assert c.get("/data").json() == {"<head>": 1}
    assert c.get("/stream").text == "data: <head>\n\ndata: 2\n\n"
    assert c.post("/").status_code == 405  # not a GET: the app answers as it would
