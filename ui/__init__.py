"""The Gradio pages: chat (ui/chat/, ui/layout.py) and the memory dashboard (ui/dashboard/).

ui/ only builds pages; the server (server/assembly.py) mounts them with the HTTP routes.
"""
