"""Paged-KV inference engine: `LLM` (the vLLM-shaped batch API), `ServingLLM` (its serving face:
sessions, pins, snapshots, tenants) and `SamplingParams` are the public API.

Imports are lazy so that `import engine.kv.block_pool` (tests, tools) does not load torch models.
"""

import os as _os
import sys as _sys

# The engine thread shares a few cores with the web server, tokenizers and other processes.
# OpenMP's default busy-waiting makes torch's thread team collapse when any core is taken
# (measured here: a [32,576]x[576,1536] GEMM fell from ~80 to ~4 GFLOP/s under load); passive
# waiting keeps it near full speed. Only effective before torch is first imported.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = [
    "LLM",
    "ServingLLM",
    "SamplingParams",
    "BeamSearchParams",
    "RequestStream",
    "RequestOutput",
    "CompletionOutput",
]

_WHERE = {
    "LLM": "engine.front.llm",
    "ServingLLM": "engine.front.serving",
    "RequestStream": "engine.front.llm",
    "SamplingParams": "engine.sampling.sampling_params",
    "BeamSearchParams": "engine.core.beam_search",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
