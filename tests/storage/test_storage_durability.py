"""Many threads on one Storage, and data surviving a SIGKILL mid-stream."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from storage import Storage

REPO = Path(__file__).resolve().parents[2]
THREADS = 20


def test_twenty_threads_write_concurrently(store):
    shared = store.create_conversation(title="shared")
    barrier = threading.Barrier(THREADS)
    errors = []

    def worker(n):
        try:
            barrier.wait()
            conv = store.create_conversation(owner=f"user{n}")
            for turn in range(5):
                store.add_message(
                    conv["id"], "user", f"thread {n} question {turn}", owner=f"user{n}"
                )
                reply = store.add_message(conv["id"], "assistant", "", status="stopped")
                for k in range(3):  # streamed updates
                    store.update_message(reply["id"], content=f"answer {n}.{turn} part {k}")
                store.update_message(reply["id"], status="complete", token_ids=[n, turn, 2])
                store.add_reply_stats(reply["id"], output_tokens=3, tokens_per_s=1.0)
                store.add_message(shared["id"], "user", f"{n}-{turn}")  # parent=None: append
                store.list_conversations(query="question")
                store.get_messages(conv["id"], owner=f"user{n}")
        except Exception as exc:  # collected, so a failure in any thread fails the test
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for n in range(THREADS):
        (conv,) = store.list_conversations(owner=f"user{n}")
        msgs = store.get_messages(conv["id"])
        assert len(msgs) == 10 and all(m["status"] == "complete" for m in msgs)
        assert (
            msgs[-1]["content"] == f"answer {n}.4 part 2"
            and msgs[-1]["stats"]["output_tokens"] == 3
        )
    # Appends to the shared conversation never raced: one unbranched chain of every message.
    chain = store.get_messages(shared["id"])
    assert len(chain) == THREADS * 5 == len({m["content"] for m in chain})
    assert all(b["parent_id"] == a["id"] for a, b in zip(chain, chain[1:]))
    assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == THREADS * 15
    assert store.db.execute("SELECT count(*) FROM reply_stats").fetchone()[0] == THREADS * 5


CHILD = textwrap.dedent("""
    import os, signal, sys
    from storage import Storage
    s = Storage(sys.argv[1])
    done = s.create_conversation(title="finished")
    for i in range(30):
        s.add_message(done["id"], "user" if i % 2 == 0 else "assistant", f"msg {i}")
    live = s.create_conversation()
    s.add_message(live["id"], "user", "tell me a story")
    reply = s.add_message(live["id"], "assistant", "", status="stopped")
    text = ""
    for i in range(50):
        text += f"word{i} "
        s.update_message(reply["id"], content=text, token_ids=list(range(i + 1)))
    print(done["id"], live["id"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close(), no checkpoint, no atexit
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_mid_stream_keeps_committed_writes(db_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(db_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    done_id, live_id = proc.stdout.split()
    wal = Path(f"{db_path}-wal")
    assert wal.exists() and wal.stat().st_size > 0  # the data is only in the un-checkpointed WAL
    with Storage(db_path) as s:
        assert [m["content"] for m in s.get_messages(done_id)] == [f"msg {i}" for i in range(30)]
        user, reply = s.get_messages(live_id)
        assert user["content"] == "tell me a story"
        assert reply["content"] == "".join(f"word{i} " for i in range(50))
        assert reply["token_ids"] == list(range(50)) and reply["status"] == "stopped"
        assert s.get_conversation(live_id)["title"] == "tell me a story"
