#!/usr/bin/env bash
# The one prepared GPU check (issue #16): one command, <= 8 minutes on an H200, one line per stage
# and a final verdict; JSON under bench/results/. Needs only the engine's requirements
# (requirements-engine.txt: torch with CUDA, triton, transformers) - no gradio, no gguf, no model
# files (random weights from engine/configs/). `--smoke` (or no GPU) runs tiny shapes on CPU with
# interpreted Triton, as CI does. Extra arguments go to scripts/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ " $* " == *" --smoke "* ]]; then
  export CUDA_VISIBLE_DEVICES=""   # smoke = the CPU path, even on a GPU machine
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export TRITON_INTERPRET=1        # no GPU: interpreted Triton (must be set before triton is imported)
fi
exec timeout 590 "$PY" scripts/gpu_check.py "$@"
