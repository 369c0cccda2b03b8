"""Measure the two maintained grammar libraries on this model's vocabulary (why we use one of them).

For each of xgrammar and llguidance: tokenizer set-up time, JSON-schema compile time, and the CPU
time to compute one token bitmask per step while walking a valid JSON document token by token.
Run: `.venv/bin/python -m bench.grammar_libs [model folder]`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age"],
}
DOC = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "tags": ["a", "c"],
        "address": {"city": "London", "zip": "W1"},
    }
)


def _ms(xs):
    return statistics.median(xs) * 1e3


def bench_llguidance(hf_tok, ids):
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    t = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf_tok)
    setup = time.perf_counter() - t
    t = time.perf_counter()
    m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
    compile_s = time.perf_counter() - t
    mask = lt.allocate_token_bitmask(1, tok.vocab_size)
    per = []
    for t_id in ids:
        t = time.perf_counter()
        lt.fill_next_token_bitmask(m, mask, 0)
        per.append(time.perf_counter() - t)
        assert m.consume_token(t_id), m.get_error()
    return setup, compile_s, per


def bench_xgrammar(hf_tok, ids, vocab):
    import xgrammar as xgr

    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    setup = time.perf_counter() - t
    t = time.perf_counter()
    cg = compiler.compile_json_schema(json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t
    m = xgr.GrammarMatcher(cg)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    per = []
    for t_id in ids:
        t = time.perf_counter()
        m.fill_next_token_bitmask(mask, 0)
        per.append(time.perf_counter() - t)
        assert m.accept_token(t_id)
    return setup, compile_s, per


def main(argv=None):
    from transformers import AutoConfig, AutoTokenizer
    from engine.exec.loader import resolve_hf_folder

    folder = (argv or sys.argv[1:] or [None])[0] or resolve_hf_folder(None)[1]
    hf_tok = AutoTokenizer.from_pretrained(folder)
    vocab = AutoConfig.from_pretrained(folder).vocab_size
    ids = hf_tok.encode(DOC, add_special_tokens=False)
    print(f"vocabulary {vocab}, document {len(ids)} tokens")
    for name, fn in (
        ("llguidance", lambda: bench_llguidance(hf_tok, ids)),
        ("xgrammar", lambda: bench_xgrammar(hf_tok, ids, vocab)),
    ):
        setup, comp, per = fn()
        print(
            f"{name:11s} tokenizer setup {setup * 1e3:8.1f} ms  schema compile {comp * 1e3:7.2f} ms  "
            f"mask/token median {_ms(per):.3f} ms  max {max(per) * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
