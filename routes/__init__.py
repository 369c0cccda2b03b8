"""HTTP-level protections around the FastAPI app: Host checks (security.py) and login (auth.py)."""
