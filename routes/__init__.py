"""HTTP routes around the FastAPI app: Host checks (security.py), login (auth.py), and the
OpenAI-compatible API at /v1 (openai_*.py)."""
