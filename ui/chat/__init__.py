"""The chat page: handlers (send/regenerate/edit/stop/follow/refresh), the Turn that generates a
reply, the tab registry (which tab shows which conversation), the sidebar, and pure view logic."""
