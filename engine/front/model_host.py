"""The engine the app serves, switchable to another model while the app runs (issue 45, item 5).

Why a host rather than a new app: the page, the routes, the tab registry and the dashboard all hold
one engine object from start-up. The host is that object: every engine member is the current
engine's (`ServingLLM`, by delegation), and `switch_model` replaces the engine underneath. A switch
loads the new model first, while the old one keeps serving; only when the new one is ready are the
requests moved over (in-flight replies of the old model end with a sentence, their conversations
stay in SQLite), and the old engine is shut down, its pool and weights freed. A model that cannot
load (unknown architecture, corrupt file, too big) is refused in plain words and the running model
keeps serving. When both models would not fit in memory at once, the old one is unloaded first and,
if the new one then fails, loaded again.

Conversations keep their stored token ids; a turn after a switch re-renders its prompt with the new
model's template (engine/text/session_prompt.continue_session_prompt only reuses ids that decode to
the rendered conversation, so another tokenizer's ids are never reused). Their old KV blocks are
dropped with the old pool; the second tier keys blocks by the model's fingerprint, so no block of
one model is ever read by another.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import threading
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.exec.loader import ModelLoadError

GIB = 2**30


@dataclass(frozen=True)
class ModelChoice:
    """One model the app may serve: `name` (what the picker and /v1/models show), `path`."""

    name: str
    path: str | None  # None: the bundled default model


def model_catalog(paths: list[str] | None) -> list[ModelChoice]:
    """The app's `--model` values as models: each HF folder or .gguf file is one; a folder with no
    config.json holds one model per .gguf file in it. No value: the bundled default model."""
    if not paths:
        return [ModelChoice("SmolLM2-135M-Instruct (bundled)", None)]
    out: list[ModelChoice] = []
    for p in paths:
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "config.json")):
            files = sorted(glob.glob(os.path.join(p, "*.gguf")))
            if not files:
                raise ModelLoadError(f"{p} has no config.json and no .gguf file")
            out += [ModelChoice(os.path.basename(f), f) for f in files]
        else:
            out.append(ModelChoice(os.path.basename(os.path.normpath(p)), p))
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    return [ModelChoice(c.path if c.name in dup else c.name, c.path) for c in out]


def _available_ram() -> int:
    from engine.exec.load_checks import available_memory_bytes

    free = available_memory_bytes()
    return free if free is not None else 1 << 62


def _weights_bytes(path: str | None) -> int:
    """A rough size of a model's weights in memory (fp32 after dequantization: 4 bytes per
    parameter), read from the files without loading them; 0 when unknown."""
    if path is None:
        return 600 * 2**20
    files = [path] if os.path.isfile(path) else glob.glob(os.path.join(path, "*.safetensors"))
    size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
    if path.endswith(".gguf"):
        size *= 8  # a quantized GGUF (~4 bits per weight) dequantizes to fp32
    return size


class ModelHost:
    """The app's engine: the current `ServingLLM` plus the models it may switch to."""

    def __init__(
        self, catalog: list[ModelChoice], config: EngineConfig, *, progress=None, factory=None
    ):
        if not catalog:
            raise ValueError("no model to serve")
        from engine.front.serving import ServingLLM

        self._factory = factory or ServingLLM
        self._catalog = list(catalog)
        self._base = config
        self._lock = threading.Lock()  # one switch at a time
        self._listeners: list = []
        self._choice = self._catalog[0]
        self._engine = self._factory(
            dataclasses.replace(config, model=self._choice.path), progress=progress
        )
        self.switching: str | None = None  # the model being loaded, for a status line

    def __getattr__(self, name):
        """Every engine member is the current engine's (ChatEngine and its abilities)."""
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    # ---- the ability (engine/protocol.SwitchesModels) -------------------------------------------
    def loadable_models(self) -> list[ModelChoice]:
        return list(self._catalog)

    def current_model(self) -> str:
        return self._choice.name

    def on_switch(self, callback) -> None:
        """callback(engine) runs after every switch, with the new engine (re-pin shared prompts)."""
        self._listeners.append(callback)

    def switch_model(self, name: str, progress=None) -> str:
        """Serve `name` (a ModelChoice name or path of the catalog) from now on; returns a sentence
        saying what the new pool holds. ModelLoadError (in plain words) when it cannot load: the
        current model keeps serving. ValueError for a name that is not in the catalog."""
        choice = next((c for c in self._catalog if name in (c.name, c.path)), None)
        if choice is None:
            raise ValueError(
                f"{name!r} is not one of this app's models: "
                f"{', '.join(c.name for c in self._catalog)}"
            )
        if not self._lock.acquire(blocking=False):
            raise ModelLoadError(
                f"another model is loading ({self.switching}); try again when it is ready"
            )
        try:
            if choice == self._choice:
                return self._summary("already serving")
            self.switching = choice.name
            cfg = dataclasses.replace(self._base, model=choice.path)
            old = self._engine
            both_fit = _weights_bytes(choice.path) * 1.3 < _available_ram()
            if both_fit:
                new = self._factory(cfg, progress=progress)  # the old one serves meanwhile
            else:
                old.shutdown()
                try:
                    new = self._factory(cfg, progress=progress)
                except Exception:
                    self._engine = self._factory(
                        dataclasses.replace(self._base, model=self._choice.path)
                    )
                    raise
            self._engine, self._choice = new, choice
            if both_fit:
                old.shutdown()
            for callback in self._listeners:
                callback(new)
            return self._summary("now serving")
        finally:
            self.switching = None
            self._lock.release()

    def _summary(self, verb: str) -> str:
        s = self._engine.stats()
        return (
            f"{verb} {self._choice.name}: KV pool of {s['total_blocks']:,} blocks x {s['block_size']} "
            f"tokens = {s['kv_capacity_tokens']:,} tokens ({s['kv_bytes_per_token']:,} B/token), "
            f"context {self._engine.max_model_len:,}"
        )

    def shutdown(self) -> dict | None:
        return self._engine.shutdown()
