#!/usr/bin/env bash
# llamacpp-logits.sh MODEL.gguf IDS [STEPS] [THREADS]: llama.cpp's top-5 logits after the prompt IDS
# (comma-separated token ids), then greedy for STEPS tokens, each step's top-5 and the gap between the
# first two. Env FA=0|1 forces flash attention off/on (default: llama.cpp's auto). For near-tie checks
# against the reference outputs. Builds scripts/llamacpp-logits.cpp against the llama.cpp static
# libraries that scripts/bench-vs-llamacpp.sh builds into $MENS_CACHE/llamacpp (built here if absent).
set -euo pipefail
model=${1:?usage: llamacpp-logits.sh MODEL.gguf IDS [STEPS] [THREADS]}
ids=${2:?token ids, comma-separated}
steps=${3:-1}
threads=${4:-2}
version=0.3.36
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
here=$(cd "$(dirname "$0")" && pwd)
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$cache/build/src/libllama.a" ]; then
  mkdir -p "$cache"
  command -v cmake >/dev/null || python3 -m pip install -q cmake
  [ -d "$src" ] || {
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$cache"
    tar xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  }
  cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build "$cache/build" --target llama -j "$(nproc)"
fi
bin="$cache/llamacpp-logits"
if [ ! -x "$bin" ] || [ "$here/llamacpp-logits.cpp" -nt "$bin" ]; then
  g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$here/llamacpp-logits.cpp" \
    "$cache/build/src/libllama.a" "$cache/build/ggml/src/libggml.a" "$cache/build/ggml/src/libggml-cpu.a" \
    "$cache/build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$bin"
fi
"$bin" "$model" "$ids" "$steps" "$threads" 2>/dev/null
