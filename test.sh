#!/usr/bin/env bash
# Install everything (app + test deps + Debian chromium) into .venv and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash test.sh -m "not slow"` for the quick inner loop.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest "$@"
