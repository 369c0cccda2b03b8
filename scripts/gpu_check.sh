#!/usr/bin/env bash
# The one prepared GPU check (issues #16, #27): `bash scripts/gpu_check.sh --out "$OUT/gpu-check.json"`.
# One line per stage, a final verdict, and the JSON rewritten after every stage (default: $OUT/gpu-check.json
# when $OUT is set, else bench/results/), so a time-out, SIGTERM or crash still leaves what was done.
# Needs only the engine's requirements (requirements-engine.txt: torch with CUDA, triton, transformers) -
# no gradio, no gguf, no model files (random weights from engine/exec/configs/). `--smoke` (or no GPU) runs tiny
# shapes on CPU with interpreted Triton, as CI does. Extra arguments go to scripts/gpu_check.py
# (--budget-s, default 480; --stages; --hard-limit-s).
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
# the check writes its JSON before its own watchdog (budget + 60 s) and on SIGTERM; -k: SIGKILL 10 s later
exec timeout -k 10 "${GPU_CHECK_TIMEOUT_S:-590}" "$PY" scripts/gpu_check.py "$@"
