"""Parse a GGUF once while transformers dequantizes it.

Why: `AutoTokenizer.from_pretrained(gguf_file=...)`, `AutoConfig` and `AutoModelForCausalLM` each build
their own `gguf.GGUFReader` over the same file, and reading the metadata (the 49k-entry vocabulary and
merges of the default model) is ~4.6 s of Python every time; the weight loader also builds gguf's
tensor-name table once per module of the model (~400 times, ~5.8 s), though it depends only on the
architecture and the layer count. Measured on the 2-core work machine, a fresh process dequantizing
the bundled SmolLM2 (the first start of the app, and of every fresh test run): 20.2 s -> 10.2 s wall,
byte-identical files.

How: inside the context, `gguf.GGUFReader` hands out one reader per (path, mode) and
`gguf.get_tensor_name_map` is memoised; transformers imports both from the `gguf` module at call
time, so it picks them up. Both are read-only in transformers' use. Outside the context nothing is
changed, and where gguf lacks either name (another version) the context does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os


@contextlib.contextmanager
def gguf_parsed_once():
    try:
        import gguf
    except ImportError:
        yield
        return
    make_reader = getattr(gguf, "GGUFReader", None)
    name_map = getattr(gguf, "get_tensor_name_map", None)
    if make_reader is None or name_map is None:
        yield
        return
    readers: dict[tuple, object] = {}

    def shared_reader(path, mode="r", *args, **kwargs):
        key = (os.path.realpath(os.fspath(path)), mode, args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = make_reader(path, mode, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared_reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, name_map
        readers.clear()
