"""OpenAI / vLLM request fields that shape the output -> the engine's StructuredSpec and logit bias.

Accepted forms (at most one constraint per request, else a 400 naming both):
- `response_format`: {"type": "text"} (none), {"type": "json_object"}, {"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}} (OpenAI; `client.chat.completions.parse` sends this).
- `structured_outputs` (vLLM's extra_body): {"json": schema} | {"regex": str} | {"choice": [str]} |
  {"grammar": lark} | {"json_object": true}; vLLM's older `guided_json` / `guided_regex` /
  `guided_choice` / `guided_grammar` top-level fields map to the same.
`strict` needs nothing extra: every object is already closed (engine/sampling/structured/compiler.py).
"""

from __future__ import annotations

from engine.sampling.structured import StructuredSpec
from routes.openai.errors import APIError

_SO_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def _spec(kind, value, param) -> StructuredSpec:
    try:
        return StructuredSpec(kind, value)
    except ValueError as e:
        raise APIError(400, str(e), param=param, code="invalid_value") from e


def _from_response_format(rf) -> StructuredSpec | None:
    if rf is None:
        return None
    t = rf.get("type", "text")
    if t == "text":
        return None
    if t == "json_object":
        return _spec("json_object", None, "response_format")
    if t == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise APIError(
                400,
                "response_format.json_schema must be {'name': ..., 'schema': {...}, 'strict': ...}",
                param="response_format",
                code="invalid_value",
            )
        return _spec("json_schema", js.get("schema", {}), "response_format")
    raise APIError(
        400,
        f"response_format: type must be text, json_object or json_schema (got {t!r})",
        param="response_format",
        code="invalid_value",
    )


def _from_extras(body) -> list[tuple[str, StructuredSpec]]:
    found = []
    so = getattr(body, "structured_outputs", None)
    if so:
        if not isinstance(so, dict):
            raise APIError(400, "structured_outputs must be an object", param="structured_outputs")
        keys = [k for k in so if k in _SO_KINDS or k == "json_object"]
        if len(keys) != 1:
            raise APIError(
                400,
                "structured_outputs: give exactly one of json, regex, choice, grammar, json_object",
                param="structured_outputs",
                code="invalid_value",
            )
        k = keys[0]
        spec = (
            _spec("json_object", None, "structured_outputs")
            if k == "json_object"
            else _spec(_SO_KINDS[k], so[k], "structured_outputs")
        )
        found.append(("structured_outputs", spec))
    extra = getattr(body, "model_extra", None) or {}
    for name, kind in _GUIDED.items():
        if extra.get(name) is not None:
            found.append((name, _spec(kind, extra[name], name)))
    return found


def structured_spec(body) -> StructuredSpec | None:
    """The request's one output constraint, or None; APIError(400) when malformed or ambiguous."""
    found = []
    rf = _from_response_format(getattr(body, "response_format", None))
    if rf is not None:
        found.append(("response_format", rf))
    found += _from_extras(body)
    if len(found) > 1:
        raise APIError(
            400,
            f"only one output constraint per request (got {', '.join(n for n, _ in found)})",
            param=found[1][0],
            code="invalid_value",
        )
    return found[0][1] if found else None


def logit_bias(body) -> dict[int, float] | None:
    """OpenAI's {"token id as string": bias in [-100, 100]} -> {int: float}."""
    lb = getattr(body, "logit_bias", None)
    if not lb:
        return None
    out = {}
    for k, v in lb.items():
        try:
            t = int(k)
        except (TypeError, ValueError):
            raise APIError(
                400,
                f"logit_bias: keys must be token ids (got {k!r})",
                param="logit_bias",
                code="invalid_value",
            ) from None
        if t < 0 or not -100 <= v <= 100:
            raise APIError(
                400,
                "logit_bias: token ids must be >= 0 and biases in [-100, 100]",
                param="logit_bias",
                code="invalid_value",
            )
        out[t] = float(v)
    return out
