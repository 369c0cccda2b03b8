"""The one fake engine of the UI tests. It implements engine.protocol.ChatEngine (checked in
test_fake_engine.py against the real LLM's members), scripts replies word by word, records what
the UI asked for, and serves a fixed KV snapshot.

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

INFO = ModelInfo(name="SmolLM2-135M-Instruct.Q4_1", source="/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 architecture="LlamaForCausalLM", num_layers=30, num_attention_heads=9, num_kv_heads=3,
                 head_dim=64, hidden_size=576, vocab_size=49152, dtype="float32", max_model_len=40,
                 block_size=16, num_blocks=64, kv_bytes_per_token=46080, max_num_seqs=4,
                 attention_backend="torch", device="cpu")


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
            m = {"state": "finished" if last else "running", "prompt_tokens": 9, "cached_tokens": 4,
                 "output_tokens": k + 1, "ttft_s": 0.1, "tokens_per_s": 20.0 if k else None}
            for i in range(self.n):
                yield None, RequestOutputDelta(self.request_id, i, word, [100 + k], last,
                                               "stop" if last else None, None, m)
            yield "pause", None
        if self.aborted:
            for i in range(self.n):
                yield None, RequestOutputDelta(self.request_id, i, "", [], True, "abort", None, {"state": "finished"})

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


class FakeLLM:
    """Implements engine.protocol.ChatEngine with scripted replies and a fixed snapshot."""

    def __init__(self, words=("Hello", " there", "!"), snapshot=None, pause_s=0.06, info=INFO):
        self.words, self.snap, self.pause_s, self.info = list(words), snapshot, pause_s, info
        self.submitted, self.previous, self.aborted, self.ended, self.closed = [], [], [], [], []
        self.tenants: list = []             # the tenant each chat turn was submitted for
        self.calls: list[str] = []                   # snapshot reads: "latest" / "exact"
        self.log: list[tuple] = []                   # ("abort", rid) / ("end", sid) / ("close", sid), in order
        self.streams: dict[str, FakeStream] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    # ---- ChatEngine ---------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    def model_info(self):
        return self.info

    def get_tokenizer(self):
        return FakeTokenizer()

    def count_prompt_tokens(self, messages):
        tok = FakeTokenizer()
        return len(tok.encode(tok.apply_chat_template(messages)))

    @staticmethod
    def prompt_ids_of(k):
        """The prompt ids the fake reports for its k-th submission."""
        return list(range(1000 * k, 1000 * k + 9))

    def submit_chat(self, messages, params=None, *, session_id=None, request_id=None, previous_ids=None,
                    cache_salt=None, tenant=None, priority=0):
        with self.lock:
            k = len(self.submitted)
            rid = request_id or f"req-{k}"
            self.submitted.append(([dict(m) for m in messages], params, session_id))
            self.tenants.append(tenant)
            self.previous.append(previous_ids)
            s = self.streams[rid] = FakeStream(self, rid, self.words, getattr(params, "n", 1),
                                               self.prompt_ids_of(k), self.pause_s)
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

    def latest_snapshot(self):
        self.calls.append("latest")
        return self.snap

    def load(self):
        return (0, 0)


def request(session="s1", username=None):
    """What Gradio passes handlers as gr.Request, as far as the UI reads it."""
    return types.SimpleNamespace(session_hash=session, username=username, query_params={})
