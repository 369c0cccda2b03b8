"""HTTP routes served next to the Gradio page: /metrics and /api/kv (metrics.py, kv.py), the guards
(security/: Host checks, logins, throttles, input caps), and the OpenAI-compatible API at /v1
(openai/)."""
