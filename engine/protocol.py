"""The face the UI and HTTP routes code against: `ChatEngine`. `engine.LLM` implements it; the UI
tests use one fake that implements it too (tests/ui/fake_engine.py), so a change here fails both.

Why a Protocol: the UI must not reach into the engine (`llm.engine.*`, private calls). Declaring
exactly what it may use keeps the seam narrow enough for a remote engine later.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ChatEngine(Protocol):
    @property
    def max_model_len(self) -> int: ...

    def model_info(self): ...                                   # engine.exec.model_info.ModelInfo

    def get_tokenizer(self): ...

    def count_prompt_tokens(self, messages: list[dict]) -> int: ...

    def submit_chat(self, messages: list[dict], params=None, *, session_id: str | None = None,
                    request_id: str | None = None, previous_ids: list[int] | None = None,
                    cache_salt: str | None = None): ...
    # -> a stream of RequestOutputDelta: sync iteration, `async for`, .abort(), .prompt_ids

    def abort(self, request_id: str) -> bool: ...

    def end_session(self, session_id: str) -> bool: ...          # release blocks, keep ids

    def close_session(self, session_id: str) -> bool: ...        # forget the session

    def snapshot(self) -> dict: ...                              # exact, taken between steps

    def latest_snapshot(self) -> dict: ...                       # recent, never blocks the caller

    def load(self) -> tuple[int, int]: ...                       # (running, waiting), a plain read
