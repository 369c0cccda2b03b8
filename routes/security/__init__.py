"""What stands in front of the page and the API: the Host guard (host_guard.py), logins and their
throttles (auth.py, login_guard.py, hash_budget.py, cross_site.py), the owner check on Gradio's
session routes (cancel_guard.py) and the input caps of /v1 (request_limits.py)."""
