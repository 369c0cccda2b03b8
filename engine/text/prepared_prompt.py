"""`PreparedPrompt`: one chat turn's prompt, rendered and tokenized once, then passed along.

Why a value of its own: a Send used to render and tokenize the same conversation twice or more
(once to count it for the "too long" answer, once more to submit it), and the two counts could
differ, because only the submit reused the previous turn's exact ids. Now the chat asks the engine
once (`ChatEngine.prepare_chat`), checks the length on this value, and hands the same value to
`submit_chat`; the ids counted are the ids the engine runs. A remote engine tokenizes on its own
server: its value carries no ids, only its estimate of the length, and its submit sends the
messages as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PreparedPrompt:
    messages: tuple[dict, ...]  # what was rendered (system prompt + branch + new message)
    thinking: bool | None  # the template's enable_thinking (None: its default)
    num_tokens: int  # len(token_ids); a remote engine's estimate
    token_ids: tuple[int, ...] | None = None  # None: the engine tokenizes elsewhere (remote)
    # which engine's tokenizer made token_ids: another engine (a model switch in between) renders
    # the messages again rather than run ids of another vocabulary
    made_by: object = field(default=None, compare=False, repr=False)

    def ids_for(self, engine, messages: list[dict], thinking: bool | None) -> list[int] | None:
        """The ids to run when `engine` submits `messages`: these, if this value was made by that
        engine for exactly these messages and switch; None (render again) otherwise."""
        if (
            self.token_ids is None
            or self.made_by is not engine
            or thinking != self.thinking
            or list(self.messages) != list(messages)
        ):
            return None
        return list(self.token_ids)
