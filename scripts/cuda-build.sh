#!/usr/bin/env bash
# Builds the CUDA-enabled `mens` binary and CUDA test binary here (no toolkit needed: kernels are
# compiled at run time by NVRTC) and packs them, stripped and xz-compressed, into .device/ for a GPU
# machine without Rust (scripts/cuda-device.sh unpacks and runs them). .device/ is ignored by git:
# name it in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p mens-cli --features cuda
test_bin=$(cargo test --release -p mens --features cuda --test cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="cuda": print(m["executable"])' | tail -1)
mkdir -p .device
strip -o .device/mens target/release/mens
strip -o .device/cuda-test "$test_bin"
xz -9 -f .device/mens .device/cuda-test
ls -la .device
