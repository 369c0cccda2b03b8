"""Paged-KV inference engine: `LLM` and `SamplingParams` are the public API.

Imports are lazy so that `import engine.block_pool` (tests, tools) does not load torch models.
"""
__all__ = ["LLM", "SamplingParams", "RequestStream", "RequestOutput", "CompletionOutput"]

_WHERE = {"LLM": "engine.llm", "RequestStream": "engine.llm", "SamplingParams": "engine.sampling_params",
          "RequestOutput": "engine.outputs", "CompletionOutput": "engine.outputs"}


def __getattr__(name):
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
