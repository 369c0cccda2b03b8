"""What every chat handler needs: the engine, the store, the tab registry and the auth rule."""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.salt_rule import principal_salt
from ui.chat.guard import check_owner
from ui.chat.tabs import Tab, TabRegistry


@dataclass
class ChatContext:
    llm: object
    storage: object
    tabs: TabRegistry
    auth: bool = False  # with --auth each user sees and may open only their own chats
    exports: object = None  # storage.exports.PrivateExports, created on the first export
    pins: object = None  # ui/chat/prompt_pins.PromptPins: pinned shared prompts (real engine only)
    admins: frozenset = frozenset()  # under --auth: users who may start demo load (--admin)
    abandon_s: float | None = (
        None  # idle timeout of a reply no tab shows (None: reattach.ABANDON_S)
    )

    def shared_prompt(self, request) -> dict:
        """The shared system prompt new chats of this user start with ({"id", "text"})."""
        return self.storage.get_system_prompt(self.owner(request) or None)

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def max_num_seqs(self) -> int:
        return self.llm.model_info().max_num_seqs

    def owner(self, request) -> str:
        """The owner recorded on new conversations ('' when running without --auth)."""
        return (getattr(request, "username", None) or "") if self.auth else ""

    def check(self, request) -> str | None:
        """The owner to check access against (None: no check, every tab sees every chat)."""
        return self.owner(request) if self.auth else None

    def cache_salt(self, request) -> str | None:
        """With --auth, each user's prefix cache is private past the shared system prompt, so
        "N/M prompt tokens from cache" cannot confirm another user's text (#12.2). Every path
        (send, n > 1, regenerate, edit, beam search) takes it from here (engine/kv/salt_rule.py)."""
        return principal_salt("user", self.owner(request), multi_user=self.auth)

    def tenant(self, request) -> str:
        """Who the fair scheduler serves this turn for: the logged-in user under --auth, else the
        one local user (engine/core/fairness.py)."""
        return f"user:{self.owner(request)}" if self.auth else "local"

    def tab(self, request) -> Tab:
        """The asking tab's state; another user's tab (a stolen session hash) raises
        guard.TabOwnerError before anything is read or changed (#12.10)."""
        username = getattr(request, "username", None)
        tab = self.tabs.get(request.session_hash, username)
        check_owner(tab, username)
        return tab

    def prompt_tokens(self, messages: list[dict], thinking: bool | None = None) -> int:
        """Length of the prompt the engine would build for these messages (no session reuse);
        `thinking`: the chat's "Think" switch (a thinking model's template renders it)."""
        if thinking is None:
            return self.llm.count_prompt_tokens(messages)
        return self.llm.count_prompt_tokens(messages, thinking)

    @property
    def thinking_switch(self) -> bool:
        """The served model's chat template has a "Think" switch (enable_thinking)."""
        return bool(self.llm.model_info().thinking_switch)

    def remember_thinking(self, conv_id: str, thinking: bool | None, request) -> None:
        """Keep the chat's "Think" switch with the chat (shown again when it is opened)."""
        if thinking is not None:
            self.storage.set_conversation_thinking(conv_id, thinking, owner=self.check(request))
