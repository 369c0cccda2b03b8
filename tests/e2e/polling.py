"""One polling helper for the end-to-end tests (app processes and browsers answer asynchronously)."""

import time


def wait_until(pred, timeout: float = 60.0, every: float = 0.1, what: str = "condition"):
    """Return pred()'s first truthy value; raise TimeoutError if none comes within timeout s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")
