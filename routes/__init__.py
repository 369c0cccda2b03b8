"""HTTP routes served next to the Gradio page: /metrics and /api/kv (routes/metrics.py); the OpenAI
API (/v1) will live here too."""
