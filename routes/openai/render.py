"""How one OpenAI call's generation becomes its answer: the streamed chunks (the opening role
delta, text / logprob / tool-call deltas, the finish, the usage chunk) and the final non-streamed
object, for /v1/chat/completions (`ChatRender`) and /v1/completions (`CompletionRender`, with echo).

Why its own file: routes/openai/api.py owns the calls' lifecycle (admission, slots, aborts, the SSE
response); this owns only their shape, and reads from the server just its model name, tokenizer and
logprob formatter. The JSON builders themselves are routes/openai/schemas.py's.

A thinking model's (Qwen3, SmolLM3) replies are split as vLLM's reasoning parsers split them:
`reasoning_content` beside `content` in the message and in the streamed deltas, and the reasoning
tokens in `usage.completion_tokens_details` (engine/text/reasoning.py holds the rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.text.reasoning import ReasoningParser, ReasoningSplit
from routes.openai import schemas as S
from routes.openai import tools as openai_tools

if TYPE_CHECKING:
    from routes.openai.api import OpenAIServer


class ChatRender:
    def __init__(
        self,
        srv: "OpenAIServer",
        body,
        cid: str,
        tools=None,
        thinking: ReasoningSplit | None = None,
    ):
        self.srv, self.body, self.cid = srv, body, cid
        self.lp = body.num_logprobs() is not None
        self.tools = tools  # routes/openai/tools.ToolPlan when tool calls are parsed
        self.thinking = thinking  # a thinking model's split (None: replies are all content)
        self.parsers: dict[int, openai_tools.ToolCallParser] = {}
        self.splitters: dict[int, ReasoningParser] = {}
        self.gen = None

    def _parser(self, i: int) -> "openai_tools.ToolCallParser":
        return self.parsers.setdefault(i, openai_tools.ToolCallParser())

    def _finish_reason(self, parser, reason):
        return "tool_calls" if parser is not None and parser.calls and reason == "stop" else reason

    def _chunk(self, created, choices, usage=None):
        if self.body.include_usage and usage is None:
            return {**S.chat_chunk(self.cid, self.srv.model, created, choices), "usage": None}
        return S.chat_chunk(self.cid, self.srv.model, created, choices, usage)

    def opening(self, created, gen):
        return [
            self._chunk(created, [S.chat_chunk_choice(i, {"role": "assistant", "content": ""})])
            for i in range(len(gen.choices))
        ]

    def _split(self, i, d) -> tuple[str, str]:
        """(reasoning, content) of delta d of choice i (all content for a model that does not think)."""
        if self.thinking is None:
            return "", d.text
        p = self.splitters.setdefault(i, self.thinking.parser())
        r, c = p.feed(d.text)
        if d.finished:
            r2, c2 = p.finish()
            r, c = r + r2, c + c2
        return r, c

    def chunks(self, created, gen, i, d):
        self.gen = gen
        out = []
        if self.tools is not None:
            return self._tool_chunks(created, i, d)
        reasoning, content = self._split(i, d)
        lp = self.srv.fmt.chat(d.logprobs or []) if self.lp and (d.text or d.token_ids) else None
        if reasoning:
            out.append(
                self._chunk(
                    created, [S.chat_chunk_choice(i, {"reasoning_content": reasoning}, None, lp)]
                )
            )
            lp = None
        if content or (self.thinking is None and (d.text or d.token_ids)) or lp is not None:
            out.append(
                self._chunk(created, [S.chat_chunk_choice(i, {"content": content}, None, lp)])
            )
        if d.finished:
            out.append(self._chunk(created, [S.chat_chunk_choice(i, {}, d.finish_reason)]))
        return out

    def _tool_chunks(self, created, i, d):
        """Text and tool-call deltas as OpenAI streams them (routes/openai/tools.ToolCallParser);
        a thinking model's reasoning goes out first as reasoning_content, only its answer is parsed."""
        p = self._parser(i)
        reasoning, content = self._split(i, d)
        events = p.feed(content) + (p.finish() if d.finished else [])
        lp = self.srv.fmt.chat(d.logprobs or []) if self.lp and d.token_ids else None
        out = []
        if reasoning:
            out.append(
                self._chunk(
                    created, [S.chat_chunk_choice(i, {"reasoning_content": reasoning}, None, lp)]
                )
            )
            lp = None
        for k, ev in enumerate(events):
            out.append(
                self._chunk(
                    created,
                    [
                        S.chat_chunk_choice(
                            i, openai_tools.stream_delta(ev), None, lp if k == 0 else None
                        )
                    ],
                )
            )
        if d.finished:
            out.append(
                self._chunk(
                    created, [S.chat_chunk_choice(i, {}, self._finish_reason(p, d.finish_reason))]
                )
            )
        return out

    def _usage(self, gen, usage):
        if self.thinking is None or gen is None:
            return usage
        return S.with_reasoning_tokens(
            usage, sum(self.thinking.tokens(c.token_ids) for c in gen.choices)
        )

    def usage_chunk(self, created, usage):
        return S.chat_chunk(self.cid, self.srv.model, created, [], self._usage(self.gen, usage))

    def final(self, cid, gen, usage):
        choices = []
        for i, c in enumerate(gen.choices):
            text, reasoning = c.text, None
            if self.thinking is not None:
                sp = self.thinking.split(c.text)
                text, reasoning = sp.content, sp.reasoning
            ch = S.chat_choice(
                i, text, c.finish_reason, self.srv.fmt.chat(c.logprobs) if self.lp else None
            )
            if self.thinking is not None:
                # a harmony reply with no analysis message has none (null, as vLLM), not ""
                harmony_none = self.thinking.is_harmony and not reasoning
                ch["message"]["reasoning_content"] = None if harmony_none else reasoning
            if self.tools is not None:
                p = openai_tools.ToolCallParser()
                p.feed(text)
                p.finish()
                ch["message"].update(p.message_fields())
                ch["finish_reason"] = self._finish_reason(p, c.finish_reason)
            choices.append(ch)
        return S.chat_completion(cid, self.srv.model, choices, self._usage(gen, usage))


class CompletionRender:
    def __init__(
        self, srv: "OpenAIServer", body, cid: str, prompt_ids: list[list[int]] | None = None
    ):
        self.srv, self.body, self.cid = srv, body, cid
        self.lp = body.num_logprobs() is not None
        self.prompt_ids = prompt_ids or []
        self.prompt_texts = [p if isinstance(p, str) else None for p in body.prompts()]

    def _echo(self, i: int, c) -> tuple[str, dict | None]:
        """echo: the prompt (its text as sent) before the reply, and its token logprobs (first: None)
        before the reply's; max_tokens 0 drops the one token generated to get there."""
        k = i // self.body.n
        ids = self.prompt_ids[k]
        prompt = self.prompt_texts[k]
        if prompt is None:
            prompt = self.srv.tokenizer.decode(ids, skip_special_tokens=False)
        keep = self.body.max_tokens != 0
        text = prompt + (c.text if keep else "")
        if not self.lp:
            return text, None
        records = [r for r in (c.prompt_logprobs or [None] * len(ids))[1:]]
        lp = self.srv.fmt.completion(records + (list(c.logprobs) if keep else []))
        first = self.srv.fmt.token(ids[0])
        lp["tokens"].insert(0, first)
        lp["token_logprobs"].insert(0, None)
        lp["top_logprobs"].insert(0, None)
        lp["text_offset"] = [o + len(first) for o in lp["text_offset"]]
        lp["text_offset"].insert(0, 0)
        return text, lp

    def opening(self, created, gen):
        return []

    def chunks(self, created, gen, i, d):
        if not (d.text or d.token_ids or d.finished):
            return []
        offset = len(gen.choices[i].text) - len(d.text)
        lp = self.srv.fmt.completion(d.logprobs or [], offset) if self.lp else None
        usage = None if self.body.include_usage else S._NO_USAGE
        return [
            S.completion(
                self.cid,
                self.srv.model,
                [S.completion_choice(i, d.text, d.finish_reason, lp)],
                usage,
                created,
            )
        ]

    def usage_chunk(self, created, usage):
        return S.completion(self.cid, self.srv.model, [], usage, created)

    def final(self, cid, gen, usage):
        choices = []
        for i, c in enumerate(gen.choices):
            if self.body.echo:
                text, lp = self._echo(i, c)
                reason = "length" if self.body.max_tokens == 0 else c.finish_reason
                choices.append(S.completion_choice(i, text, reason, lp))
            else:
                choices.append(
                    S.completion_choice(
                        i,
                        c.text,
                        c.finish_reason,
                        self.srv.fmt.completion(c.logprobs) if self.lp else None,
                    )
                )
        return S.completion(cid, self.srv.model, choices, usage)
