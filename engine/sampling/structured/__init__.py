"""Constrained decoding: a request's output is held to a JSON schema, any JSON object, a regex, a
choice list or a grammar by masking, each step, the tokens the grammar cannot accept next.

Pieces, one concept each: `spec` (what a request asks for; plain data, no library), `compiler`
(the grammar library behind it, compiled grammars cached), `state` (one sequence's matcher, which
forks with n > 1 and survives preemption because it follows the sequence's own tokens), `bitmask`
(the packed int32 masks and their application to the logits on the logits' device).
"""

from engine.sampling.structured.spec import StructuredSpec, StructuredUnavailable

__all__ = ["StructuredSpec", "StructuredUnavailable"]
