"""The faces the UI, the HTTP routes, the remote backend and the load generators code against.

`ChatEngine` is what every engine the chat can run on has (engine.LLM, backends.RemoteEngine, the UI
tests' fake). Everything else is an optional ability with its own runtime-checkable Protocol; code
that may run on an engine without it asks `isinstance(llm, Ability)` (never `hasattr`), so each
member it touches is declared here once. engine.LLM implements them all; the UI tests' one fake
(tests/ui/fake_engine.py) too, so a change here fails both (tests/ui/test_fake_engine.py), and
tests/ui/test_engine_members.py fails when ui/, routes/ or backends/ call a member on the engine
that no Protocol below declares.

Why Protocols: the UI must not reach into the engine (`llm.engine.*`, private calls). Declaring
exactly what it may use keeps the seam narrow enough for a remote engine.

Annotations are strings (no import above the base floor): TenantStats / FairnessEvent live in
engine/core/tenancy.py, ModelInfo in engine/exec/model_info.py, KVSnapshot in engine/observe/.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ChatEngine(Protocol):
    """What the chat needs from any engine, local or remote."""

    kind: str  # "local" | "remote"

    @property
    def max_model_len(self) -> int: ...

    @property
    def model_source(self) -> str: ...  # a folder, a file or "model at URL"

    def model_info(self): ...  # engine.exec.model_info.ModelInfo

    def get_tokenizer(self): ...

    def count_prompt_tokens(self, messages: list[dict], thinking: bool | None = None) -> int: ...

    def prepare_chat(
        self,
        messages: list[dict],
        *,
        previous_ids: list[int] | None = None,
        session_id: str | None = None,
        thinking: bool | None = None,
    ): ...

    # -> engine.text.prepared_prompt.PreparedPrompt: a chat turn's prompt rendered and tokenized
    # once, counted for "too long" and handed to submit_chat (a remote engine: no ids, an estimate)

    def submit_chat(
        self,
        messages: list[dict],
        params=None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        previous_ids: list[int] | None = None,
        cache_salt: str | None = None,
        thinking: bool | None = None,
        prepared=None,
    ): ...

    # thinking: the chat template's enable_thinking (None: its default); ModelInfo.thinking_switch
    # says whether the template has one (a remote engine sends it as vLLM's chat_template_kwargs)
    # prepared: prepare_chat's value for these messages: its ids run as they are (a remote engine
    # sends the messages and ignores it)
    # -> a stream of RequestOutputDelta: sync iteration, `async for`, .abort(), .prompt_ids

    def abort(self, request_id: str) -> bool: ...

    def end_session(self, session_id: str) -> bool: ...  # release blocks, keep ids

    def close_session(self, session_id: str) -> bool: ...  # forget the session

    def snapshot(self) -> dict: ...  # exact, taken between steps

    def latest_snapshot(self) -> dict: ...  # recent, never blocks the caller

    def load(self) -> tuple[int, int]: ...  # (running, waiting), a plain read

    def shutdown(self) -> dict | None: ...  # a graceful stop; what it kept in the KV tier


# ---- optional abilities ---------------------------------------------------------------------------


@runtime_checkable
class ReportsStats(Protocol):
    """The stats contract as a dict (KVStats.to_json), without building a whole snapshot."""

    def stats(self) -> dict: ...


@runtime_checkable
class ServesSnapshotForms(Protocol):
    """The typed snapshot, the compact form and the shared serialized body (/api/kv, /metrics), and
    how long a reader may wait for a due snapshot (bench: loadgen/bench_snapshot_burst.py)."""

    def kv_snapshot(self): ...  # engine.observe.kv_contract.KVSnapshot

    def latest_snapshot(self, compact: bool = False) -> dict: ...

    def latest_snapshot_bytes(self, compact: bool = False) -> bytes: ...

    def set_snapshot_wait(self, max_wait_s: float) -> None: ...


@runtime_checkable
class ServesTenants(Protocol):
    """Per-tenant rows and fairness events (engine.LLM; a remote backend has none)."""

    def tenant_stats(self, fresh: bool = False) -> list: ...  # [engine.core.tenancy.TenantStats]

    def fairness_events(
        self, fresh: bool = False
    ) -> list: ...  # [engine.core.tenancy.FairnessEvent]


@runtime_checkable
class Configured(Protocol):
    """An engine with a local EngineConfig (block_size, max_num_seqs, scheduling_policy, ...)."""

    config: object  # engine.config.EngineConfig


@runtime_checkable
class ReportsQueuePosition(Protocol):
    def queue_position(self, request_id: str) -> int | None: ...  # 1-based among waiting requests


@runtime_checkable
class ConstrainsOutput(Protocol):
    """Structured output: compile a StructuredSpec now (a ValueError names what is wrong)."""

    def compile_structured(self, spec) -> None: ...


@runtime_checkable
class ContinuesReplies(Protocol):
    """Extend a stored reply in place (the chat's Continue)."""

    def submit_continue(
        self,
        token_ids: list[int],
        params,
        messages: list[dict],
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ): ...


@runtime_checkable
class BeamSearches(Protocol):
    def submit_beam_search(
        self,
        prompt,
        params,
        *,
        on_step=None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ): ...


@runtime_checkable
class PinsPrompts(Protocol):
    """Pinned prefixes: the shared system prompt's blocks held for every chat."""

    def pin_system_prompt(self, name: str, text: str): ...

    def system_prefix_ids(self, text: str) -> list[int]: ...

    def check_pin(self, name: str, num_tokens: int) -> None: ...

    def pins(self) -> list: ...

    def unpin(self, name: str) -> bool: ...


@runtime_checkable
class ServesCompletions(Protocol):
    """What the OpenAI API (/v1) needs on top of ChatEngine: raw prompts, admission bounds."""

    admission: object  # engine.core.admission.AdmissionControl

    def encode_prompt(self, prompt) -> list[int]: ...

    def submit(
        self,
        prompt,
        params=None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ): ...


@runtime_checkable
class SwitchesModels(Protocol):
    """An app that may serve several models, one at a time (engine/front/model_host.ModelHost):
    the models it may load, the one it serves, and a switch (the old model keeps serving until
    the new one is ready; a model that cannot load is refused in plain words)."""

    def loadable_models(self) -> list: ...  # [ModelChoice(name, path)]

    def current_model(self) -> str: ...

    def switch_model(self, name: str, progress=None) -> str: ...  # -> what the new pool holds

    def on_switch(self, callback) -> None: ...  # callback(new engine)


@runtime_checkable
class RemoteBackend(Protocol):
    """A chat engine on another server (backends/remote.py): where it is, its own /metrics."""

    root: str
    model: str | None

    def metrics_text(self) -> str | None: ...


@runtime_checkable
class ServesReplicas(Protocol):
    """Several remote replicas behind one chat (backends/cluster_engine.py): their KV-event models
    and /metrics for the cluster Memory tab, the turns' landings, and how turns are routed."""

    routing: str

    def cluster_view(self): ...  # backends.kv_cluster.Cluster

    def recent_landings(self) -> list: ...  # [{replica, tokens, ...}]


ABILITIES = (
    ReportsStats,
    ServesSnapshotForms,
    ServesTenants,
    Configured,
    ReportsQueuePosition,
    ConstrainsOutput,
    ContinuesReplies,
    BeamSearches,
    PinsPrompts,
    ServesCompletions,
    SwitchesModels,
    RemoteBackend,
    ServesReplicas,
)
PROTOCOLS = (ChatEngine, *ABILITIES)


def declared_members() -> set[str]:
    """Every member some Protocol above declares (the AST check of ui/, routes/, backends/)."""
    out: set[str] = set()
    for p in PROTOCOLS:
        out |= protocol_members(p)
    return out


def protocol_members(proto) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {k for k in vars(proto) if not k.startswith("_")}
    return names
