#!/usr/bin/env bash
# synth-conditioning.sh SHAPE [IDS]: how far engines that differ only by rounding part on a
# `mens synth --shape` file: every position's logits of one token sequence from mens's CPU kernel
# sets (MENS_CPU unset = the best this CPU has, avx2, portable) and from llama.cpp
# (scripts/llamacpp-logits.sh's ALL mode), compared by relative L2 and argmax. A well-conditioned
# file keeps them within rounding; the GPU-against-CPU model-file test (tests/cuda.rs) assumes it.
# Needs python3 with numpy, and llama.cpp built by scripts/llamacpp-logits.sh.
set -euo pipefail
shape=${1:?usage: synth-conditioning.sh SHAPE [IDS]}
dir=${TMPDIR:-/tmp}/mens-conditioning
mkdir -p "$dir"
ids=${2:-$(python3 -c 'import random; r=random.Random(9); print(",".join(str(r.randrange(256)) for _ in range(160)))')}
cd "$(dirname "$0")/.."
cargo build --release -q -p mens-cli -p mens --example logits_all
m="$dir/synth-$shape.gguf"
target/release/mens synth --shape "$shape" -o "$m" >/dev/null 2>&1
for cpu in native avx2 portable; do
  MENS_CPU=$([ $cpu = native ] || echo $cpu) target/release/examples/logits_all "$m" "$ids" "$dir/$cpu.bin"
done
ALL="$dir/llama.json" bash scripts/llamacpp-logits.sh "$m" "$ids" 1 2 >/dev/null
python3 - "$dir" <<'PY'
import json, sys, numpy as np
d = sys.argv[1]
ref = np.array(json.load(open(f"{d}/llama.json"))["logits"], dtype=np.float32)
n, v = ref.shape
M = {k: np.fromfile(f"{d}/{k}.bin", dtype=np.float32).reshape(n, v) for k in ["native", "avx2", "portable"]}
M["llama.cpp"] = ref
rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
names = list(M)
for i, a in enumerate(names):
    for b in names[i + 1:]:
        e = [rel(M[a][p], M[b][p]) for p in range(n)]
        ag = sum(int(M[a][p].argmax() == M[b][p].argmax()) for p in range(n))
        print(f"{a:9} vs {b:9}: median {np.median(e):.2e}, worst {max(e):.2e} (position {int(np.argmax(e))}), argmax {ag}/{n}")
PY
