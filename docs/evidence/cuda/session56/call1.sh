#!/usr/bin/env bash
# Session 56, one device call: the q8k probe with five rounds (clean timings of the staged 8-row
# kernel against the engine's kernels on the GPU layouts), then the verify table of the synth 7B. Run from the repository root with .device and bench/cuda-q8k/probe.ptx carried.
set -u
O=${OUT:-/tmp/out}
. scripts/device-setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
(cd bench/cuda-q8k && ROUNDS=5 PYTHONUNBUFFERED=1 timeout 300 python3 -u probe.py probe.ptx \
   q4kr:18944x3584 q4kr:3584x18944 q6kr:3584x18944 q6kr:152064x3584) > $O/probe.txt 2>&1
for s in 7b; do $BIN/mens synth --shape $s -o $M/synth-$s.gguf > /dev/null 2>&1; done
for r in 1 2; do
  for s in 7b; do
    timeout 100 $BIN/mens bench -m $M/synth-$s.gguf --backend cuda --prompt 16 --steps 0 --depth 512 --gen 64 \
      --reps 3 --paired 0 --verify 1,2,4,8,16 --verify-depth 512 -q >> $O/verify.txt 2>&1
  done
done
tail -5 $O/probe.txt; grep -E 'verify|tg64' $O/verify.txt
