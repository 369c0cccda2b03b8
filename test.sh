#!/usr/bin/env bash
# Install everything (app + test deps + Debian chromium) into .venv and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash test.sh -m "not slow"` for the quick inner loop.
# Two workers (one per core), one test file per worker at a time so module fixtures (an app process,
# a model) are built once; PYTEST_WORKERS=0 runs serially. App processes fork from a zygote that has
# the app's modules imported (tests/e2e/app_zygote.py). Each worker, and the app processes it starts,
# computes on cores / workers threads: two workers already fill two cores, and two-thread OpenMP
# teams in both would wait on each other's descheduled threads (the suite ran ~8% longer). The kernel
# tests still run their parallel paths at two threads (tests/kernels/conftest.py).
set -euo pipefail
cd "$(dirname "$0")"
# These machines set PYTHONDONTWRITEBYTECODE=1: then none of the suite's ~60 Python processes (two
# workers, pytest / gpu-check / bench children) finds the repo's modules or pytest's rewritten test
# modules compiled, and each compiles them again (collecting the suite: 9.9 s uncached, 5.5 s cached).
# The caches go to __pycache__/ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh --test
# One style (ruff.toml, issue 46): lint and format are checked before any test runs (~1 s).
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
workers=${PYTEST_WORKERS:-2}
if [ "$workers" = 0 ]; then exec .venv/bin/python -m pytest "$@"; fi
cores=$(nproc 2>/dev/null || echo 2)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / workers > 0 ? cores / workers : 1 ))}
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
