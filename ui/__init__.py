"""The Gradio page: chat (ui/chat/, ui/layout.py) and the memory dashboard (ui/dashboard/)."""
__all__ = ["build_app"]


def build_app(*args, **kwargs):
    from ui.layout import build_app as _build
    return _build(*args, **kwargs)
