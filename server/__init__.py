"""The server: assembles the FastAPI app (the Gradio page, /metrics, /api/kv, /v1, exports, security,
pinned prompts) around an engine and a storage, and runs it (uvicorn, signals, the share link).

The top of the import graph below app.py: server imports ui, routes, storage, backends and engine;
nothing in the product imports server (tests/test_import_graph.py).
"""

__all__ = ["build_app", "serve"]


def build_app(*args, **kwargs):
    from server.assembly import build_app as _build

    return _build(*args, **kwargs)


def serve(*args, **kwargs):
    from server.run import serve as _serve

    return _serve(*args, **kwargs)
