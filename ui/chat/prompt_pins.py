"""Keeps the engine's pinned prompts in step with the shared system prompts in storage.

Why: the shared system prompt is the one thing every new chat has in common, so its KV blocks are
prefilled once and pinned (engine/kv/pinning.py): never evicted, attached by every new chat with
refcount + 1. The app pins its own prompt and every user's own one at start-up, and a prompt
when it is saved; saving under
the same pin name replaces (and so unpins) the old one. Under --auth each user's own prompt has
its own pin ("user:<name>"); users without one share the app's.

Saving is refused, with a message for that user only, when the prompt is longer than
MAX_PROMPT_SHARE of the context (issue 12: a 200x repeated prompt made every chat "too long"), or
when pinning it would pass the pin cap (10% of the pool by default).
Pinning itself runs in a background thread (a prefill of a few hundred tokens), so the save
returns at once; until it lands, chats still share the prompt through the ordinary prefix cache.
"""

from __future__ import annotations

import threading
import traceback

from engine.observe.viewer_scope import pin_name_for

MAX_PROMPT_SHARE = 0.25  # a shared system prompt may use at most a quarter of the context


class PromptPins:
    def __init__(self, llm, storage):
        self.llm, self.storage = llm, storage
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.events: list[str] = []  # "pinned prompt ... (N blocks)", newest last

    def measure(self, text: str) -> tuple[int, int]:
        """(tokens of the prompt's shared prefix, full blocks it would share)."""
        ids = self.llm.system_prefix_ids(text)
        return len(ids), len(ids) // self.llm.model_info().block_size

    def check(self, owner: str | None, text: str) -> tuple[int, int]:
        """Raise ValueError with a user-facing message if the prompt may not be saved."""
        if not (text or "").strip():
            raise ValueError("The shared system prompt cannot be empty.")
        limit = int(self.llm.max_model_len * MAX_PROMPT_SHARE)
        if len(text) > 40 * limit:  # cheap bound before tokenizing a huge paste
            raise ValueError(f"That prompt is far too long: the limit is {limit:,} tokens.")
        ntok, nblocks = self.measure(text)
        if ntok > limit:
            raise ValueError(
                f"That prompt is {ntok:,} tokens; a shared system prompt may use at most "
                f"{limit:,} ({MAX_PROMPT_SHARE:.0%} of the {self.llm.max_model_len:,}-token context)."
            )
        self.llm.check_pin(pin_name_for(owner), nblocks * self.llm.model_info().block_size)
        return ntok, nblocks

    def fit_default(self) -> str | None:
        """At start-up: if the app's shared prompt is still the built-in default and the context is
        too small for it (over MAX_PROMPT_SHARE), switch to the short default and say why."""
        from storage.presets import DEFAULT_SYSTEM_PROMPT, SHORT_SYSTEM_PROMPT

        if self.storage.get_system_prompt()["text"] != DEFAULT_SYSTEM_PROMPT:
            return None
        ntok, _ = self.measure(DEFAULT_SYSTEM_PROMPT)
        limit = int(self.llm.max_model_len * MAX_PROMPT_SHARE)
        if ntok <= limit:
            return None
        self.storage.set_system_prompt(SHORT_SYSTEM_PROMPT)
        return (
            f"the default {ntok}-token system prompt is more than {MAX_PROMPT_SHARE:.0%} of the "
            f"{self.llm.max_model_len}-token context; using a short one instead"
        )

    def pin(self, owner: str | None, text: str) -> None:
        """Pin `text` for `owner` (None/'': the app's prompt), synchronously. A prompt shorter than
        one block has no full block to share (each chat keeps it in its own partial block): nothing
        is pinned, and an earlier, longer prompt's pin of that name is released, not left behind."""
        name, who = pin_name_for(owner), (f"{owner}'s prompt" if owner else "the shared prompt")
        ntok, nblocks = self.measure(text)
        if nblocks == 0:
            self.llm.unpin(name)
            bs = self.llm.model_info().block_size
            self._event(
                f"{who} is {ntok} tokens, shorter than one {bs}-token block: nothing to pin "
                f"(each chat keeps it in its own partial block)"
            )
            return
        info = self.llm.pin_system_prompt(name, text)
        self._event(f"pinned {who} ({info.num_blocks} blocks, {info.num_tokens} tokens)")

    def _event(self, text: str) -> None:
        with self._lock:
            self.events.append(text)
            del self.events[:-20]

    def pin_async(self, owner: str | None, text: str) -> threading.Thread:
        def run():
            try:
                self.pin(owner, text)
            except Exception as e:  # logged; chats still share through the cache
                traceback.print_exc()
                self.errors.append(f"pinning failed: {e}")

        t = threading.Thread(target=run, name="pin-prompt", daemon=True)
        t.start()
        return t

    def pin_startup(self) -> threading.Thread:
        """Pin the app's current shared prompt (the default on a fresh database), then every
        user's own saved prompt (--auth), most recently saved first, while the pin cap allows;
        one that no longer fits is left to the ordinary prefix cache and said in the terminal."""

        def run():
            try:
                self.pin(None, self.storage.get_system_prompt()["text"])
            except Exception as e:
                traceback.print_exc()
                self.errors.append(f"pinning failed: {e}")
            for owner, text in self.storage.users_with_own_prompt():
                try:
                    self.check(owner, text)
                    self.pin(owner, text)
                except ValueError as e:  # over the cap or too long for this context now
                    print(f"[app] {owner}'s shared prompt is not pinned: {e}", flush=True)
                except Exception as e:
                    traceback.print_exc()
                    self.errors.append(f"pinning {owner}'s prompt failed: {e}")

        t = threading.Thread(target=run, name="pin-prompts", daemon=True)
        t.start()
        return t

    def describe(self, text: str) -> str:
        """'546 tokens · shares 34 blocks (pinned)': shown when a preset is chosen."""
        try:
            ntok, nblocks = self.measure(text)
        except ValueError as e:
            return str(e)
        return (
            f"{ntok:,} tokens · every new chat shares its {nblocks} full blocks "
            f"({ntok - nblocks * self.llm.model_info().block_size} tokens in a partial block are its own)"
        )
