"""Private export files: written 0600 inside per-export 0700 folders, and cleaned up.

Exports used to be left world-readable (0644) in a shared temp folder forever; another local
account could read every exported chat. `PrivateExports` owns one private root folder, writes
each export into its own fresh subfolder (so two exports with the same title never collide and
a file name reveals nothing about the others), removes exports older than `max_age_s` whenever a
new one is written, and removes everything on `close()`.

Downloads: each export gets a random 128-bit token and remembers its owner (the logged-in user
under --auth, None for the local single user). The app serves it at `/exports/<token>/<name>`
(routes/exports.py) only to that owner. Exports used to be handed to Gradio as a file, which
copied them into its own cache and served that copy at `/gradio_api/file=...` to any logged-in
user who had the URL; `open()` here is the only way to an export's bytes.

Leftovers (#29.10): a root made by the default constructor records its process id (`.owner-pid`).
`close()` never runs after a `kill -9`, so each new default instance sweeps the roots of the same
account in the temp folder whose process is gone (or, for roots without the record, that are
older than max_age_s). Only plain 0700 folders named `paged-chat-exports-*` owned by this account
are touched; symbolic links and others' folders are left alone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

DEFAULT_MAX_AGE_S = 15 * 60  # long enough to click "download", short enough not to pile up
ROOT_PREFIX = "paged-chat-exports-"
PID_FILE = ".owner-pid"


def export_url(token: str, name: str) -> str:
    """The download path of an export, relative to the page (works under a proxy's sub-path too):
    what the page links (ui/chat/sidebar.py) and the route answers (routes/exports.py)."""
    return f"exports/{token}/{quote(name)}"


@dataclass(frozen=True)
class Export:
    """One written export: where it is, who may download it, and the token that names it."""

    token: str
    path: Path
    owner: str | None
    size: int

    @property
    def name(self) -> str:
        return self.path.name


class PrivateExports:
    def __init__(self, root: str | os.PathLike | None = None, max_age_s: float = DEFAULT_MAX_AGE_S):
        if root is None:
            sweep_leftover_roots(Path(tempfile.gettempdir()), max_age_s)
            self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))  # mkdtemp: 0700
            fd = os.open(self.root / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
        else:
            self.root = Path(root)
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.root, 0o700)
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._by_token: dict[str, Export] = {}

    def write(self, filename: str, data: str | bytes, owner: str | None = None) -> Export:
        """Write one export for `owner`; older exports past max_age_s are removed first."""
        name = _safe_name(filename)
        self.cleanup()
        folder = Path(tempfile.mkdtemp(dir=self.root))
        path = folder / name
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        export = Export(secrets.token_urlsafe(16), path, owner, len(payload))
        with self._lock:
            self._by_token[export.token] = export
        return export

    def open(self, token: str, user: str | None) -> Export | None:
        """The export named by `token` if `user` owns it and it still exists, else None (the same
        answer for a wrong token, another user's export and an expired one: nothing to infer)."""
        with self._lock:
            export = self._by_token.get(token) if isinstance(token, str) else None
        if export is None or export.owner != user or not export.path.is_file():
            return None
        return export

    def cleanup(self, max_age_s: float | None = None) -> int:
        """Remove export folders older than max_age_s (default: the instance's); returns how many."""
        limit = self.max_age_s if max_age_s is None else max_age_s
        cutoff = time.time() - limit
        removed = 0
        with self._lock:
            if not self.root.exists():
                return 0
            for entry in self.root.iterdir():
                try:
                    if entry.is_dir() and entry.stat().st_mtime <= cutoff:
                        shutil.rmtree(entry, ignore_errors=True)
                        removed += 1
                except FileNotFoundError:
                    pass
            self._by_token = {t: e for t, e in self._by_token.items() if e.path.exists()}
        return removed

    def close(self) -> None:
        """Remove every export (call at shutdown)."""
        with self._lock:
            shutil.rmtree(self.root, ignore_errors=True)
            self._by_token.clear()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_leftover_roots(tmp: Path, max_age_s: float = DEFAULT_MAX_AGE_S) -> int:
    """Remove export roots of this account left by processes that are gone; returns how many."""
    import stat

    removed, now = 0, time.time()
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(ROOT_PREFIX):
            continue
        try:
            st = entry.lstat()
            if (
                not stat.S_ISDIR(st.st_mode)
                or st.st_uid != os.getuid()
                or stat.S_IMODE(st.st_mode) != 0o700
            ):
                continue
            try:
                pid = int((entry / PID_FILE).read_text().strip())
                stale = pid != os.getpid() and not _process_alive(pid)
            except (OSError, ValueError):  # no record (an older version): judge by age
                stale = now - st.st_mtime > max_age_s
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _safe_name(filename: str) -> str:
    """A plain file name: no folders, no hidden files, nothing the OS would treat specially."""
    if not isinstance(filename, str):
        raise ValueError("export file name must be a string")
    name = filename.replace("\x00", "").strip()
    if (
        not name
        or name != os.path.basename(name)
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or name.startswith(".")
    ):
        raise ValueError(f"export file name {filename!r} is not a plain file name")
    return name[:200]
