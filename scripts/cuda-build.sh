#!/usr/bin/env bash
# Builds the CUDA-enabled `mens` binary and CUDA test binary here (no toolkit needed: kernels are
# compiled at run time by NVRTC) and packs them, stripped and xz-compressed, into .device/ for a GPU
# machine without Rust (scripts/device-setup.sh unpacks them there). .device/ is ignored by git:
# name it in the device call's carry list.
# The kernels' PTX for sm_90 is compiled here too, into .device/ptx (NVRTC's cache, keyed by source
# and defines): one set for each ';'-separated entry of PTX_DEFS (default: the default build),
# which scripts/device-setup.sh puts in the device's cache, sparing each call a compile there.
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
rm -rf .device/ptx
nvrtc=$PWD/.cache/nvrtc/nvidia/cu13/lib
IFS=';' read -r -a defsets <<< "${PTX_DEFS:-}"
[ ${#defsets[@]} -gt 0 ] || defsets=("")
for defs in "${defsets[@]}"; do
  LD_LIBRARY_PATH="$nvrtc:${LD_LIBRARY_PATH:-}" MENS_CUDA_CACHE=$PWD/.device/ptx MENS_CUDA_DEFINES="$defs" \
    "$test_bin" kernels_compile_with_nvrtc --exact --quiet 2>&1 | grep -E "test result|SKIP|panicked" | sed "s/^/PTX '$defs': /"
done
# Nothing to pack where NVRTC is missing here (the test says SKIP): the device then compiles.
if compgen -G ".device/ptx/*.ptx" >/dev/null; then xz -9 -f .device/ptx/*.ptx; fi
ls -la .device
