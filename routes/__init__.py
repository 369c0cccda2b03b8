"""HTTP routes served next to the Gradio page (the OpenAI-compatible API lives in openai_*.py)."""
