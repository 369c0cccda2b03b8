"""Request bodies of the OpenAI API (pydantic) and the response objects we send back (plain dicts).

Kept free of engine imports so a future remote backend (the UI talking to vLLM / SGLang / another
app.py) can validate and parse the very same shapes. Ranges follow OpenAI's reference; fields we
do not implement are accepted only at their neutral value and otherwise rejected with a 400 that
names them, never silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_N = 16  # choices per request: each is a sequence sharing the prompt's blocks
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name ... are ignored
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    tool_calls: list[dict] | None = (
        None  # assistant turns that called tools (routes/openai/tools.py)
    )
    tool_call_id: str | None = None  # tool turns: which call this result answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="allow")  # unknown vendor fields (user, metadata...) ignored
    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    priority: int | None = Field(
        None, ge=-1000, le=1000
    )  # vLLM's: lower first (engine/core/fairness.py)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling fields (clients pass them in `extra_body`)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    ignore_eos: bool = False
    speculative: bool | None = None  # ours: False opts this request out of --speculative drafting

    @model_validator(mode="after")
    def _check_common(self):
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} sequences")
        if self.top_k == 0:
            raise ValueError("top_k: must be -1 (off) or >= 1")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        return self

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list | None = None  # routes/openai/tools.py
    tool_choice: object | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None  # routes/openai/structured.py
    structured_outputs: dict | None = (
        None  # vLLM's extra: {json | regex | choice | grammar | json_object}
    )
    continue_final_message: bool = False  # vLLM's extras: extend the last assistant message
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None  # vLLM's extra; enable_thinking, reasoning_effort used
    reasoning_effort: Literal["low", "medium", "high"] | None = None  # OpenAI's; gpt-oss's template

    @model_validator(mode="after")
    def _check_chat(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message: requires add_generation_prompt to be false")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message: the last message must be the assistant's")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    def token_limit(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the sampled token's logprob plus k alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def enable_thinking(self) -> bool | None:
        """chat_template_kwargs' enable_thinking (Qwen3, SmolLM3 templates); None: the template's default."""
        v = (self.chat_template_kwargs or {}).get("enable_thinking")
        return v if isinstance(v, bool) else None

    def effort(self) -> str | None:
        """reasoning_effort (OpenAI's field, else chat_template_kwargs'); None: the template's default.
        A value outside low / medium / high is refused when the template renders."""
        return self.reasoning_effort or (self.chat_template_kwargs or {}).get("reasoning_effort")


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; 0 only with echo (scoring)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_completion(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 is only allowed with echo (prompt scoring)")
        if self.max_tokens == 0 and self.stream:
            raise ValueError("max_tokens: 0 is not supported with stream")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of: only best_of == n is supported")
        if self.suffix:
            raise ValueError(
                "suffix: fill-in-the-middle is not supported by this server (its model has no "
                "infill tokens); send the text before the gap as the prompt"
            )
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: must not be empty")
        return self

    def prompts(self) -> list:
        """One entry per prompt: a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def num_logprobs(self) -> int | None:
        return self.logprobs


# ---- responses ------------------------------------------------------------------------------------

_NO_USAGE = object()  # completion(): leave the "usage" key out entirely


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def model_list(model_id: str, created: int, max_model_len: int, loadable: list[str] = ()) -> dict:
    """The served model first ("loaded": true), then the models this app may switch to (the chat
    page's picker; "loaded": false: a request naming one gets a 404 saying which one is served)."""
    served = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "paged-chat",
        "max_model_len": max_model_len,
        "loaded": True,
    }
    return {
        "object": "list",
        "data": [served]
        + [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "paged-chat",
                "loaded": False,
            }
            for name in loadable
        ],
    }


def chat_completion(cid: str, model: str, choices: list[dict], usage_: dict) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage_,
    }


def chat_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text, "refusal": None},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def with_reasoning_tokens(usage_: dict, reasoning_tokens: int) -> dict:
    """OpenAI's usage detail for a thinking model's reply."""
    return {**usage_, "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}


def chat_chunk(
    cid: str, model: str, created: int, choices: list[dict], usage_: dict | None = None
) -> dict:
    out = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if usage_ is not None:
        out["usage"] = usage_
    return out


def chat_chunk_choice(
    index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None
) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def completion(
    cid: str,
    model: str,
    choices: list[dict],
    usage_,
    created: int | None = None,
    obj: str = "text_completion",
) -> dict:
    out = {
        "id": cid,
        "object": obj,
        "created": created or int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }
    if usage_ is not _NO_USAGE:
        out["usage"] = usage_
    return out


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict | None
) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
