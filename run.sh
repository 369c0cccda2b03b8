#!/usr/bin/env bash
# Install everything into .venv and start the app: bash run.sh [app.py flags]
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python app.py "$@"
