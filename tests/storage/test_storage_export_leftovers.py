"""Issue #29.10: exports written by a process killed with -9 are swept at the next start; a live
process's exports and other folders are left alone. Real processes, real files."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from storage.exports import PrivateExports

ROOT = Path(__file__).resolve().parents[2]
CHILD = (
    "import sys, time\nfrom storage.exports import PrivateExports\n"
    "e = PrivateExports()\ne.write('secret.json', 'tangerine-42')\nprint(e.root, flush=True)\ntime.sleep(120)\n"
)


def _start(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)},
    )
    return proc, Path(proc.stdout.readline().strip())


def test_exports_of_a_killed_process_are_swept_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, dead_root = _start(tmp_path)
    alive, alive_root = _start(tmp_path)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert any(p.name == "secret.json" for p in dead_root.rglob("*"))  # left behind by kill -9
        unrelated = tmp_path / "paged-chat-exports-not-ours"
        unrelated.mkdir(mode=0o755)  # not 0700: not ours to judge
        exports = PrivateExports()
        assert not dead_root.exists()
        assert alive_root.exists() and any(p.name == "secret.json" for p in alive_root.rglob("*"))
        assert unrelated.exists()
        exports.close()
    finally:
        alive.kill()
        alive.wait()
