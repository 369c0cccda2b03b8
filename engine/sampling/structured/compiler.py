"""The grammar library behind constrained decoding (llguidance), and a cache of compiled grammars.

Why llguidance (measured on this model's 49,152-token vocabulary with `python -m bench.grammar_libs`,
see docs/BENCHMARKS.md): one dependency-free abi3 wheel (xgrammar 0.2 pulls apache-tvm-ffi and
takes ~1.6 s to import here); its matchers `deep_copy` (each n > 1 fork gets its own state in
microseconds); JSON schema, regex and Lark grammars (with embedded `%json`) through one entry
point; bad schemas come back as a readable error rather than an exception deep in a step. Its mask
costs ~0.02 ms per token here (xgrammar ~0.002 ms): both are far below a decode step.

Before compiling, nested counted repetition is bounded (bounds.py): llguidance builds its lexer
lazily, so `a{1000}{1000}` would compile and then fail mid-generation; it is refused here instead.

Compilation runs in the submitting thread (`LLM.submit`), never in the engine's step loop: a
request that compiles a large schema waits alone, not the batch. Each compiled grammar is kept as
a pristine matcher; a request gets a `deep_copy` of it, so a repeated schema costs no compile.
The engine imports and runs without the library; only structured requests are refused.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from engine.sampling.structured.bounds import check_repetition
from engine.sampling.structured.spec import StructuredSpec, StructuredUnavailable

try:  # optional: see requirements-engine.txt
    import llguidance
    import llguidance.hf
except ImportError:  # pragma: no cover - exercised by the missing-library test
    llguidance = None

CACHE_SIZE = 128
# JSON without free whitespace: a small model can otherwise spend its whole budget on blank lines
# inside an object (the schema still fixes what is valid; only the spacing is pinned).
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def available() -> bool:
    return llguidance is not None


def closed_objects(schema):
    """A copy of `schema` where objects that list properties but say nothing about others allow
    none (`additionalProperties: false`). Every output still validates against the original
    schema; it only stops a small model from appending invented keys until it runs out of tokens
    (OpenAI's strict mode demands exactly this of every object anyway)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: closed_objects(v) if k not in ("enum", "const", "default", "examples") else v
        for k, v in schema.items()
    }
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and "patternProperties" not in schema
        and "unevaluatedProperties" not in schema
    ):
        out["additionalProperties"] = False
    return out


def grammar_text(spec: StructuredSpec) -> str:
    """The llguidance grammar for a spec (a JSON string llguidance's matcher takes)."""
    M = llguidance.LLMatcher
    if spec.kind == "json_object":
        return M.grammar_from_json_schema(
            json.dumps({"type": "object", "x-guidance": JSON_OPTIONS})
        )
    if spec.kind == "json_schema":
        schema = closed_objects(spec.value) if isinstance(spec.value, dict) else {}
        if spec.value is False:
            raise ValueError("structured: the schema `false` accepts nothing")
        return M.grammar_from_json_schema(json.dumps({**schema, "x-guidance": JSON_OPTIONS}))
    if spec.kind == "regex":
        return M.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        return M.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.value))
    return M.grammar_from_lark(spec.value)


class GrammarCompiler:
    """Thread-safe: compiles specs into pristine matchers, cached by the spec's canonical key."""

    def __init__(self, hf_tokenizer, vocab_size: int):
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self._tok = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, object] = OrderedDict()
        self.compiles = 0  # grammars compiled (cache misses)
        self.hits = 0
        self.last_compile_s = 0.0

    def _tokenizer(self):
        if self._tok is None:  # ~0.4 s once: the vocabulary's byte strings, built on first use
            self._tok = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size)
        return self._tok

    def matcher(self, spec: StructuredSpec):
        """A fresh matcher for `spec` (its own state). ValueError for a bad schema / grammar,
        StructuredUnavailable when the library is not installed."""
        if llguidance is None:
            raise StructuredUnavailable(
                "structured outputs need the 'llguidance' package, which is not installed on this server "
                "(pip install llguidance)"
            )
        import time

        key = spec.key()
        with self._lock:
            pristine = self._cache.get(key)
            if pristine is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return pristine.deep_copy()
            t = time.perf_counter()
            try:
                check_repetition(spec.kind, spec.value)  # a 400 now, not a 500 mid-reply
                text = grammar_text(spec)
            except ValueError:
                raise
            except Exception as e:  # the library's own parse errors (regex / lark syntax)
                raise ValueError(f"structured: the {spec.kind} is not valid: {e}") from e
            m = llguidance.LLMatcher(self._tokenizer(), text)
            if m.is_error():
                raise ValueError(f"structured: the {spec.kind} is not valid: {m.get_error()}")
            self.last_compile_s = time.perf_counter() - t
            self.compiles += 1
            self._cache[key] = m
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return m.deep_copy()

    def tokenize(self, text: str) -> list[int]:
        """The library tokenizer's ids for `text` (to feed text that followed a lazy trigger)."""
        return self._tokenizer().tokenize_str(text)
