"""Engines the chat UI can run on besides the embedded one: `RemoteEngine` (any OpenAI-compatible server)."""

from backends.remote import BackendError, RemoteEngine

__all__ = ["BackendError", "RemoteEngine"]
