#!/usr/bin/env bash
# arch-reference.sh [ARCH…]: llama.cpp's logits at every position of a fixed prompt on the tiny
# random-weight model of each architecture (default: qwen3 llama3), written as `mens synth --tiny`
# writes it, into crates/mens/tests/data/arch/ARCH.json with the file's FNV-1a hash. The test
# `crates/mens/tests/arch.rs` checks mens against them. Needs a built mens and llama.cpp (built by
# scripts/llamacpp-logits.sh when absent).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(qwen3 llama3)
mens=${MENS:-$root/target/release/mens}
ids="260,100,101,102,32,97,100,100,40,97,44,32,98,41,58,10,32,32,32,32,114,101,116,117,114,110,32,97,256,258,43,32,98,10,259,257"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$root/crates/mens/tests/data/arch"
for arch in "${archs[@]}"; do
  "$mens" synth --tiny "$arch" -o "$tmp/$arch.gguf"
  ALL="$tmp/$arch.json" FA=1 "$here/llamacpp-logits.sh" "$tmp/$arch.gguf" "$ids" 0 1
  python3 - "$tmp/$arch.gguf" "$tmp/$arch.json" "$root/crates/mens/tests/data/arch/$arch.json" <<'PY'
import json, sys
gguf, src, dst = sys.argv[1:]
d = json.load(open(src))
h = 0xcbf29ce484222325
for b in open(gguf, "rb").read():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
out = {"gguf_fnv1a64": "%016x" % h,
       "source": "llama.cpp (llama-cpp-python 0.3.36 sdist), scripts/arch-reference.sh",
       "ids": d["ids"], "logits": d["logits"]}
json.dump(out, open(dst, "w"))
print(dst, len(out["logits"]), "positions")
PY
done
