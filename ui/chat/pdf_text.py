"""A PDF's text layer, read in a bounded worker process (issue 48.4).

Why a process: pypdf is pure Python and its cost is the file's to choose. A 7.6 KB PDF whose 40
pages share one compressed content stream took 74 s of server CPU (each page inflates and parses
the same stream again), and within the old limits (300 pages, 16 MB) such a file could hold a core
for hours; a thread cannot be stopped, a process can. So the parent (`read_pdf`) runs this file
as a script (`python -I pdf_text.py ...`: it imports only the standard library and pypdf, never
the app) and the child:
- caps its own memory (RLIMIT_AS) and CPU time (RLIMIT_CPU) before pypdf is imported; the parent
  also kills it after a wall-clock limit;
- adds up, before extracting anything, the inflated size of every content stream and form
  XObject each page draws (a stream shared by 40 pages counts 40 times: that is the work
  extraction would do) and refuses the file past a total budget, in plain words, at once;
- then extracts page by page within the page and text limits, as before.
It prints one JSON object: {"text": ...} or {"refused": "<sentence without the file name>"}.
"""

from __future__ import annotations

import json
import sys

MEMORY_BYTES = 768 * 1024 * 1024  # the worker's address space (python + pypdf need ~100 MB)
CPU_S = 10  # the worker's CPU seconds (RLIMIT_CPU)
TIME_S = 15.0  # wall clock, enforced by the parent (CPU_S caps the work)
MAX_INFLATED_BYTES = 32 * 1024 * 1024  # page content + form XObjects, summed over pages
_FORM_DEPTH = 8  # nested form XObjects followed for the budget


def _limit_self(memory_bytes: int, cpu_s: int) -> None:
    import resource

    for what, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_s)):
        soft, hard = resource.getrlimit(what)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(what, (cap, hard))


def _drawn_bytes(page, budget: int) -> int:
    """Inflated bytes of the page's content streams and of the form XObjects it can draw (each
    object once per page, nested forms to _FORM_DEPTH); stops counting past `budget`."""
    from pypdf.generic import ArrayObject, DictionaryObject

    total, seen = 0, set()

    def stream_size(obj) -> int:
        key = getattr(obj, "indirect_reference", None)
        key = (key.idnum, key.generation) if key is not None else id(obj)
        if key in seen:
            return 0
        seen.add(key)
        data = obj.get_data() if hasattr(obj, "get_data") else b""
        return len(data)

    contents = page.get("/Contents")
    contents = contents.get_object() if contents is not None else None
    if contents is None:
        contents = []
    for s in contents if isinstance(contents, ArrayObject) else [contents]:
        total += stream_size(s.get_object())
        if total > budget:
            return total

    def forms(resources, depth: int) -> None:
        nonlocal total
        resources = resources.get_object() if resources is not None else None
        if depth > _FORM_DEPTH or not isinstance(resources, DictionaryObject):
            return
        xobjects = resources.get("/XObject")
        xobjects = xobjects.get_object() if xobjects is not None else None
        if not isinstance(xobjects, DictionaryObject):
            return
        for ref in xobjects.values():
            x = ref.get_object()
            if not isinstance(x, DictionaryObject) or x.get("/Subtype") != "/Form":
                continue
            total += stream_size(x)
            if total > budget:
                return
            forms(x.get("/Resources"), depth + 1)

    forms(page.get("/Resources"), 0)
    return total


def extract(path: str, max_pages: int, max_text_bytes: int, max_inflated: int) -> dict:
    """{"text": ...} or {"refused": sentence}; the parent adds the file's name."""
    import pypdf

    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted:
            return {"refused": "is an encrypted PDF"}
        n = len(reader.pages)
        if n > max_pages:
            return {"refused": f"has {n:,} pages; a PDF may have at most {max_pages}"}
        inflated = 0
        for page in reader.pages:
            inflated += _drawn_bytes(page, max_inflated - inflated)
            if inflated > max_inflated:
                return {
                    "refused": f"unpacks to more than {max_inflated:,} bytes of page content "
                    f"(its pages reuse compressed data); this server reads at most "
                    f"that much per document"
                }
        parts, total = [], 0
        for page in reader.pages:
            t = (page.extract_text() or "").strip()
            total += len(t.encode("utf-8"))
            if total > max_text_bytes:
                return {
                    "refused": f"'s text is over {max_text_bytes:,} bytes, the most a document "
                    f"may have"
                }
            parts.append(t)
    except MemoryError:
        return {"refused": f"needs more than {MEMORY_BYTES // 2**20:,} MB of memory to read"}
    except Exception as e:  # malformed, truncated, unsupported: this file only
        return {"refused": f"could not be read as a PDF ({type(e).__name__})"}
    return {"text": "\n\n".join(p for p in parts if p)}


def main(argv: list[str]) -> int:
    path, max_pages, max_text, max_inflated, memory, cpu = argv
    _limit_self(int(memory), int(cpu))
    try:
        import pypdf  # noqa: F401
    except ImportError:
        out = {"missing": "pypdf"}
    else:
        out = extract(path, int(max_pages), int(max_text), int(max_inflated))
    sys.stdout.write(json.dumps(out))
    return 0


def read_pdf(
    path: str,
    max_pages: int,
    max_text_bytes: int,
    *,
    max_inflated: int | None = None,
    time_s: float | None = None,
    memory_bytes: int | None = None,
    cpu_s: int | None = None,
) -> dict:
    """Run `extract` in a child process within the limits (module defaults when None). Returns
    its answer, or {"refused": ...} when the child was stopped or failed."""
    import os
    import subprocess

    time_s = TIME_S if time_s is None else time_s
    cpu_s = CPU_S if cpu_s is None else cpu_s
    memory_bytes = MEMORY_BYTES if memory_bytes is None else memory_bytes
    max_inflated = MAX_INFLATED_BYTES if max_inflated is None else max_inflated
    args = [
        sys.executable,
        "-I",
        os.path.abspath(__file__),
        path,
        str(max_pages),
        str(max_text_bytes),
        str(max_inflated),
        str(memory_bytes),
        str(cpu_s),
    ]
    try:
        done = subprocess.run(args, capture_output=True, timeout=time_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:  # run() has killed and reaped it
        return {
            "refused": f"took more than {time_s:g} s to read, the most this server spends on "
            f"one document (a PDF built to be slow?)"
        }
    if done.returncode != 0:
        return {
            "refused": f"could not be read within this server's limits for one document "
            f"({cpu_s} s of CPU, {memory_bytes // 2**20:,} MB of memory)"
        }
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"refused": "could not be read as a PDF (no answer from the reader)"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
