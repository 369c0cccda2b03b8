"""The OpenAI-compatible API at /v1 on the embedded engine: the app (api.py), who may call it
(keys.py) and when (admission.py), request fields to engine values (params.py, structured.py,
tools.py), answers and streams (render.py, stream.py, schemas.py), errors and counters."""
