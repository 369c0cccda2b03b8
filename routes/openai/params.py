"""OpenAI request fields -> our SamplingParams, and engine logprobs -> OpenAI's logprobs objects.

Sampling features land in the engine one by one (penalties, logprobs); a field the engine does not
have yet is rejected with a clear 400 naming it instead of being dropped, so a client never gets
silently different sampling than it asked for. Detection is by SamplingParams' fields, so nothing
here changes when the engine gains them.
"""

from __future__ import annotations

import dataclasses

from engine.sampling.sampling_params import SamplingParams
from routes.openai.errors import APIError
from routes.openai.schemas import ChatCompletionRequest
from routes.openai.structured import logit_bias


def _has_field(name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(SamplingParams)}


def to_sampling_params(req, prompt_len: int, max_model_len: int, structured=None) -> SamplingParams:
    """Build the engine's parameters for one prompt; APIError(400) for anything out of range.
    `structured`: the constraint the route derived (response_format, tools), if any."""
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len}",
            param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
            code="context_length_exceeded",
        )
    limit = req.token_limit()
    if limit is not None and limit > room:
        param = (
            "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
        )
        raise APIError(
            400,
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len}, so at most {room} can be generated (requested {limit})",
            param=param,
            code="context_length_exceeded",
        )
    kw = dict(
        n=req.n,
        max_tokens=limit if limit is not None else room,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=req.stop_list(),
        seed=req.seed,
        ignore_eos=req.ignore_eos,
    )
    for name in ("top_k", "min_p", "repetition_penalty"):  # vLLM extras
        if getattr(req, name) is not None:
            kw[name] = getattr(req, name)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is None or value == 0:
            continue
        if not _has_field(name):
            raise APIError(
                400,
                f"{name} is not supported by this engine yet (only 0 is accepted)",
                param=name,
                code="unsupported_parameter",
            )
        kw[name] = value
    if req.speculative is False:  # the engine's --speculative, off for this request
        kw["speculative"] = False
    if limit == 0:  # echo-only scoring: one token is generated and dropped
        kw["max_tokens"] = 1
    if structured is not None:
        kw["structured"] = structured
    bias = logit_bias(req)
    if bias:
        kw["logit_bias"] = bias
    if getattr(req, "echo", False) and req.num_logprobs() is not None:
        kw["prompt_logprobs"] = (
            req.num_logprobs()
        )  # /v1/completions echo: the prompt's own logprobs
    k = req.num_logprobs()
    if k is not None:
        if not _has_field("logprobs"):
            raise APIError(
                400,
                "logprobs are not supported by this engine yet",
                param="logprobs",
                code="unsupported_parameter",
            )
        kw["logprobs"] = k
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise APIError(400, str(e), code="invalid_value") from e


class LogprobFormatter:
    """Turns the engine's TokenLogprob records (token_id, logprob, top) into OpenAI's two shapes."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._cache: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        s = self._cache.get(token_id)
        if s is None:
            s = self.tok.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = s
        return s

    def chat(self, records) -> dict | None:
        """`{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}` (chat completions)."""
        if records is None:
            return None
        content = []
        for r in records:
            t = self.token(r.token_id)
            content.append(
                {
                    "token": t,
                    "logprob": float(r.logprob),
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {
                            "token": self.token(i),
                            "logprob": float(lp),
                            "bytes": list(self.token(i).encode()),
                        }
                        for i, lp in r.top
                    ],
                }
            )
        return {"content": content, "refusal": None}

    def completion(self, records, text_offset: int = 0) -> dict | None:
        """`{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}` (legacy completions)."""
        if records is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = text_offset
        for r in records:
            t = self.token(r.token_id)
            out["tokens"].append(t)
            out["token_logprobs"].append(float(r.logprob))
            out["top_logprobs"].append({self.token(i): float(lp) for i, lp in r.top})
            out["text_offset"].append(offset)
            offset += len(t)
        return out
