"""HTTP routes served next to the Gradio page: /metrics and /api/kv (metrics.py), Host checks
(security.py), login (auth.py), and the OpenAI-compatible API at /v1 (openai_*.py)."""
