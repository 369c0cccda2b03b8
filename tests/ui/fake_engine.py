"""The one fake engine of the UI tests. It implements engine.protocol.ChatEngine and every optional
ability declared there (checked in test_fake_engine.py against the Protocols and the real LLM's
members), scripts replies word by word, records what the UI asked for, and serves a fixed KV
snapshot.

Streams work both ways the UI consumes them: `async for` (chat handlers) and plain iteration in a
thread (the dashboard's simulated users). `gate` (a threading.Event) pauses every stream, so a
test can hold a reply mid-way; abort() ends it the way the engine does (a final "abort" delta).
"""

from __future__ import annotations

import asyncio
import threading
import time
import types

from engine.exec.model_info import ModelInfo
from engine.core.sequence import RequestOutputDelta
from engine.observe.kv_contract import compact_json
from engine.observe.snapshot_cache import json_bytes
from engine.text.prepared_prompt import PreparedPrompt

INFO = ModelInfo(
    name="SmolLM2-135M-Instruct.Q4_1",
    source="/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    architecture="LlamaForCausalLM",
    num_layers=30,
    num_attention_heads=9,
    num_kv_heads=3,
    head_dim=64,
    hidden_size=576,
    vocab_size=49152,
    dtype="float32",
    max_model_len=40,
    block_size=16,
    num_blocks=64,
    kv_bytes_per_token=46080,
    max_num_seqs=4,
    attention_backend="torch",
    device="cpu",
)


class FakeTokenizer:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"

    def encode(self, text, add_special_tokens=False):
        return text.split()


class FakeStream:
    """One scripted reply: a "running" delta, then one word per step (every output index)."""

    def __init__(self, llm, rid, words, n, prompt_ids, pause_s):
        self.llm, self.request_id, self.words, self.n = llm, rid, list(words), n
        self.prompt_ids, self.pause_s, self.aborted = prompt_ids, pause_s, False

    def _deltas(self):
        m0 = {"state": "running", "prompt_tokens": 9, "cached_tokens": 4, "output_tokens": 0}
        yield None, RequestOutputDelta(self.request_id, 0, "", [], metrics=m0)
        for k, word in enumerate(self.words):
            yield "gate", None
            if self.aborted:
                break
            last = k == len(self.words) - 1
            m = {
                "state": "finished" if last else "running",
                "prompt_tokens": 9,
                "cached_tokens": 4,
                "output_tokens": k + 1,
                "ttft_s": 0.1,
                "tokens_per_s": 20.0 if k else None,
            }
            for i in range(self.n):
                yield (
                    None,
                    RequestOutputDelta(
                        self.request_id, i, word, [100 + k], last, "stop" if last else None, None, m
                    ),
                )
            yield "pause", None
        if self.aborted:
            for i in range(self.n):
                yield (
                    None,
                    RequestOutputDelta(
                        self.request_id, i, "", [], True, "abort", None, {"state": "finished"}
                    ),
                )

    async def _agen(self):
        for what, d in self._deltas():
            if what == "gate":
                while not self.llm.gate.is_set():
                    await asyncio.sleep(0.005)
            elif what == "pause":
                await asyncio.sleep(self.pause_s)
            else:
                yield d

    def __aiter__(self):
        return self._agen()

    def __iter__(self):
        for what, d in self._deltas():
            if what == "gate":
                self.llm.gate.wait()
            elif what == "pause":
                time.sleep(self.pause_s)
            else:
                yield d

    def abort(self):
        self.llm.abort(self.request_id)


class FakeSnapshot:
    """What kv_snapshot() returns: the fixed snapshot, with KVSnapshot's to_json(compact=...)."""

    def __init__(self, snap):
        self.snap = snap

    def to_json(self, compact: bool = False) -> dict:
        return compact_json(self.snap) if compact and "block_runs" in self.snap else self.snap


class FakeAdmission:
    """engine.core.admission.AdmissionControl as far as /v1 reads it: nothing queued."""

    def queued(self, tenant=None) -> tuple[int, int]:
        return (0, 0)


class FakeLLM:
    """Implements engine.protocol.ChatEngine and its optional abilities with scripted replies and a
    fixed snapshot."""

    kind = "local"
    root = "local"
    admission = FakeAdmission()

    def __init__(self, words=("Hello", " there", "!"), snapshot=None, pause_s=0.06, info=INFO):
        self.words, self.snap, self.pause_s, self.info = list(words), snapshot, pause_s, info
        self.submitted, self.previous, self.aborted, self.ended, self.closed = [], [], [], [], []
        self.tenants: list = []  # the tenant each chat turn was submitted for
        self.thinking: list = []  # the `thinking` each chat turn was submitted with
        self.calls: list[str] = []  # snapshot reads: "latest" / "exact"
        self.log: list[tuple] = []  # ("abort", rid) / ("end", sid) / ("close", sid), in order
        self.streams: dict[str, FakeStream] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.config = types.SimpleNamespace(
            block_size=info.block_size, max_num_seqs=info.max_num_seqs, scheduling_policy="fair"
        )
        self.structured: list = []  # specs compiled (the reply format check)
        self.pinned: dict[str, list[int]] = {}  # pin name -> token ids
        self.snapshot_wait_s = 0.2
        self.shut_down = False
        self.models = ["fake-model", "other-model"]  # SwitchesModels: names; the first is served
        self.switches: list[str] = []
        self._on_switch: list = []

    # ---- SwitchesModels -----------------------------------------------------------------------
    def loadable_models(self):
        return [types.SimpleNamespace(name=n, path=n) for n in self.models]

    def current_model(self):
        return self.models[0]

    def switch_model(self, name, progress=None):
        if name not in self.models:
            raise ValueError(f"{name!r} is not one of this app's models")
        self.switches.append(name)
        self.models.remove(name)
        self.models.insert(0, name)
        for callback in self._on_switch:
            callback(self)
        return f"now serving {name}"

    def on_switch(self, callback):
        self._on_switch.append(callback)

    # ---- ChatEngine ---------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    def model_info(self):
        return self.info

    def get_tokenizer(self):
        return FakeTokenizer()

    def count_prompt_tokens(self, messages, thinking=None):
        tok = FakeTokenizer()
        return len(tok.encode(tok.apply_chat_template(messages)))

    def prepare_chat(self, messages, *, previous_ids=None, session_id=None, thinking=None):
        """Like a remote engine's: the length, no ids."""
        return PreparedPrompt(
            tuple(messages), thinking, self.count_prompt_tokens(messages, thinking)
        )

    @staticmethod
    def prompt_ids_of(k):
        """The prompt ids the fake reports for its k-th submission."""
        return list(range(1000 * k, 1000 * k + 9))

    def submit_chat(
        self,
        messages,
        params=None,
        *,
        session_id=None,
        request_id=None,
        previous_ids=None,
        cache_salt=None,
        tenant=None,
        priority=0,
        thinking=None,
        prepared=None,
    ):
        with self.lock:
            self.thinking.append(thinking)
            k = len(self.submitted)
            rid = request_id or f"req-{k}"
            self.submitted.append(([dict(m) for m in messages], params, session_id))
            self.tenants.append(tenant)
            self.previous.append(previous_ids)
            s = self.streams[rid] = FakeStream(
                self, rid, self.words, getattr(params, "n", 1), self.prompt_ids_of(k), self.pause_s
            )
        return s

    def abort(self, request_id):
        with self.lock:
            self.aborted.append(request_id)
            self.log.append(("abort", request_id))
            if request_id in self.streams:
                self.streams[request_id].aborted = True
        return True

    def end_session(self, session_id):
        with self.lock:
            self.ended.append(session_id)
            self.log.append(("end", session_id))
        return True

    def close_session(self, session_id):
        with self.lock:
            self.closed.append(session_id)
            self.log.append(("close", session_id))
        return True

    def snapshot(self):
        self.calls.append("exact")
        return self.snap

    def latest_snapshot(self, compact=False):
        self.calls.append("latest")
        return self.snap

    def load(self):
        return (0, 0)

    @property
    def model_source(self) -> str:
        return self.info.source

    @property
    def model(self) -> str:
        return self.info.name

    def shutdown(self) -> None:
        self.shut_down = True

    # ---- optional abilities (engine/protocol.py) ----------------------------------------------
    def stats(self):  # ReportsStats: the snapshot's stats
        return self.latest_snapshot()["stats"]

    def kv_snapshot(self):  # ServesSnapshotForms
        self.calls.append("exact")
        return FakeSnapshot(self.snap)

    def latest_snapshot_bytes(self, compact=False):
        return json_bytes(FakeSnapshot(self.latest_snapshot()).to_json(compact))

    def set_snapshot_wait(self, max_wait_s):
        self.snapshot_wait_s = max_wait_s

    def tenant_stats(self, fresh=False):  # ServesTenants: no tenant rows
        return []

    def fairness_events(self, fresh=False):
        return []

    def queue_position(self, request_id):  # ReportsQueuePosition: nothing ever waits
        return None

    def compile_structured(self, spec):  # ConstrainsOutput: every spec is accepted
        self.structured.append(spec)

    def submit_continue(
        self,
        token_ids,
        params,
        messages,
        *,
        session_id=None,
        request_id=None,
        cache_salt=None,
        tenant=None,
        priority=0,
    ):  # ContinuesReplies
        return self.submit_chat(
            messages,
            params,
            session_id=session_id,
            request_id=request_id,
            previous_ids=list(token_ids),
            cache_salt=cache_salt,
            tenant=tenant,
            priority=priority,
        )

    def submit_beam_search(
        self,
        prompt,
        params,
        *,
        on_step=None,
        request_id=None,
        cache_salt=None,
        tenant=None,
        priority=0,
    ):
        raise ValueError("the fake engine has no beam search")  # BeamSearches: refused

    def system_prefix_ids(self, text):  # PinsPrompts
        return FakeTokenizer().encode(text)

    def check_pin(self, name, num_tokens):
        if num_tokens > self.info.num_blocks * self.info.block_size // 2:
            raise ValueError(f"pinning {num_tokens} tokens passes the pin cap")

    def pin_system_prompt(self, name, text):
        ids = self.system_prefix_ids(text)
        self.check_pin(name, len(ids))
        self.pinned[name] = ids
        return types.SimpleNamespace(name=name, num_tokens=len(ids))

    def pins(self):
        return [types.SimpleNamespace(name=k, num_tokens=len(v)) for k, v in self.pinned.items()]

    def unpin(self, name):
        return self.pinned.pop(name, None) is not None

    def encode_prompt(self, prompt):  # ServesCompletions
        if isinstance(prompt, dict):
            return list(prompt["prompt_token_ids"])
        return FakeTokenizer().encode(prompt) if isinstance(prompt, str) else list(prompt)

    def submit(
        self,
        prompt,
        params=None,
        *,
        session_id=None,
        request_id=None,
        cache_salt=None,
        tenant=None,
        priority=0,
    ):
        return self.submit_chat(
            [{"role": "user", "content": str(prompt)}],
            params,
            session_id=session_id,
            request_id=request_id,
            cache_salt=cache_salt,
            tenant=tenant,
            priority=priority,
        )

    def metrics_text(self):  # RemoteBackend: a local engine serves none
        return None

    routing = "none"  # ServesReplicas: a local engine has no replicas

    def cluster_view(self):
        return None

    def recent_landings(self) -> list:
        return []


def request(session="s1", username=None):
    """What Gradio passes handlers as gr.Request, as far as the UI reads it."""
    return types.SimpleNamespace(session_hash=session, username=username, query_params={})
