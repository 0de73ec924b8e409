#!/usr/bin/env bash
# llamacpp-build.sh [TARGET…]: build llama.cpp's tools (default: llama-bench llama-server) from the
# llama-cpp-python 0.3.36 sdist (it vendors llama.cpp's source) into $MENS_CACHE/llamacpp (default
# ~/.cache/mens/llamacpp); prints the bin directory. Nothing of llama.cpp is committed.
# x86-64 flags are explicit, AMX off: a GGML_NATIVE=ON build dies with SIGILL in its AMX kernel on
# these machines (no tile configuration on the thread that runs it).
set -euo pipefail
version=0.3.36
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
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
cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
  "${flags[@]}" > "$cache/configure.log" 2>&1 || { tail -30 "$cache/configure.log" >&2; exit 1; }
cmake --build "$cache/build" --target "${targets[@]}" -j "$(nproc)" > "$cache/build.log" 2>&1 \
  || { grep -m 20 -i "error" "$cache/build.log" >&2; exit 1; }
echo "$cache/build/bin"
