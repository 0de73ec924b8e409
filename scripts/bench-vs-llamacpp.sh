#!/usr/bin/env bash
# bench-vs-llamacpp.sh MODEL.gguf [THREADS]: llama-bench and `mens bench` on the same file, same
# settings, one Markdown table with the ratio mens / llama.cpp per row.
# llama.cpp is obtained by package name: the llama-cpp-python sdist vendors its source; llama-bench is
# built from it once with CMake into $MENS_CACHE/llamacpp (default ~/.cache/mens/llamacpp). Nothing of
# llama.cpp is committed. Run on an otherwise idle machine.
set -euo pipefail
model=${1:?usage: bench-vs-llamacpp.sh MODEL.gguf [THREADS]}
threads=${2:-2}
version=0.3.36
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
bench="$cache/build/bin/llama-bench"
here=$(cd "$(dirname "$0")/.." && pwd)
mens=${MENS_BIN:-$here/target/release/mens}

if [ ! -x "$bench" ]; then
  mkdir -p "$cache"
  command -v cmake >/dev/null || python3 -m pip install -q cmake
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$cache"
  tar xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
  cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build "$cache/build" --target llama-bench -j "$(nproc)"
fi
[ -x "$mens" ] || (cd "$here" && cargo build --release)

out=$(mktemp -d)
"$bench" -m "$model" -t "$threads" -p 512 -n 128 -d 0,512 -r 3 -o json > "$out/llama.json"
"$mens" bench -m "$model" -t "$threads" --prompt 512 --gen 128 --depth 0,512 --reps 3 --json "$out/mens.json" > /dev/null
python3 - "$out/llama.json" "$out/mens.json" "$model" "$threads" <<'PY'
import json, sys, os
llama, mens = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def key(n_prompt, n_gen, depth): return (n_prompt, n_gen, depth)
ll = {key(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)): r["avg_ts"] for r in llama}
print(f"model {os.path.basename(sys.argv[3])}, {sys.argv[4]} threads")
print("| test | mens tok/s | llama.cpp tok/s | mens / llama.cpp |")
print("|---|---|---|---|")
for r in mens["results"]:
    k = key(r["n_prompt"], r["n_gen"], r["n_depth"])
    name = f'{r["test"]}' + (f' @ d{r["n_depth"]}' if r["n_depth"] else "")
    other = ll.get(k)
    ratio = f'{r["tokens_per_s"] / other:.2f}' if other else "–"
    print(f'| {name} | {r["tokens_per_s"]:.1f} | {other:.1f} | {ratio} |' if other else f'| {name} | {r["tokens_per_s"]:.1f} | – | – |')
PY
