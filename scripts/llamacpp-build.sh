#!/usr/bin/env bash
# llamacpp-build.sh [--cuda] [TARGET…]: build llama.cpp's tools (default: llama-bench llama-server) from
# the llama-cpp-python 0.3.36 sdist (it vendors llama.cpp's source) into $MENS_CACHE/llamacpp (default
# ~/.cache/mens/llamacpp; build-cuda for --cuda); prints the bin directory. Nothing of llama.cpp is
# committed. --cuda: its CUDA backend for sm_90 (the H200), with the toolkit in $CUDA_HOME (default
# /opt/cuda, made by scripts/cuda-toolkit.sh); no GPU is needed to build.
# x86-64 flags are explicit, AMX off: a GGML_NATIVE=ON build dies with SIGILL in its AMX kernel on
# these machines (no tile configuration on the thread that runs it).
set -euo pipefail
version=0.3.36
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
cuda=0
if [ "${1:-}" = --cuda ]; then cuda=1; shift; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-bench llama-server)
mkdir -p "$cache"
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -d "$src" ]; then
  command -v cmake >/dev/null || python3 -m pip install -q cmake
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$cache"
  tar xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
fi
flags=(-DGGML_NATIVE=ON)
if [ "$(uname -m)" = x86_64 ]; then
  flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
  if grep -q avx512f /proc/cpuinfo; then
    flags+=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON)
  fi
  grep -q avx_vnni /proc/cpuinfo && flags+=(-DGGML_AVX_VNNI=ON)
  flags+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
build="$cache/build"
if [ $cuda = 1 ]; then
  export CUDA_HOME=${CUDA_HOME:-/opt/cuda} CUDA_PATH=${CUDA_HOME:-/opt/cuda} PATH="${CUDA_HOME:-/opt/cuda}/bin:$PATH"
  flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc"
    -DCUDAToolkit_ROOT="$CUDA_HOME" -DLLAMA_USE_PREBUILT_UI=OFF)
  build="$cache/build-cuda"
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  "${flags[@]}" > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log" >&2; exit 1; }
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" > "$build.log" 2>&1 \
  || { grep -m 20 -i "error" "$build.log" >&2; exit 1; }
echo "$build/bin"
