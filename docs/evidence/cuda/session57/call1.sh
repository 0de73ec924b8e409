#!/usr/bin/env bash
# Session 57: the staged 8-row probe (bench/cuda-q8k/stage8.cu) against the engine's batch tile, on
# the 7B's gate (Q4_KR 18944x3584), LM head (Q6_KR 152064x3584) and down (Q4_KR 3584x18944)
# shapes, then Nsight Compute on the gate's kernels. Run from the repository root with
# bench/cuda-q8k/probe.ptx carried (python3 bench/cuda-q8k/build.py makes it).
set -u
O=${OUT:-/tmp/out}
mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
cd bench/cuda-q8k
ROUNDS=3 PYTHONUNBUFFERED=1 timeout 240 python3 -u stage8.py probe.ptx \
  q4kr:18944x3584 q6kr:152064x3584 q4kr:3584x18944 > $O/stage8.txt 2>&1
echo "stage8 exit $?" >> $O/stage8.txt
NCU=1 timeout 150 ncu --clock-control none -k regex:"matmul_q8_8_q4kr|s8_q4kr_2|s8_q4kr_4" --launch-count 11 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  python3 -u stage8.py probe.ptx q4kr:18944x3584 > $O/ncu.txt 2>&1
echo "ncu exit $?" >> $O/ncu.txt
cat $O/gpu.txt; grep -vE '^$' $O/stage8.txt
grep -E "^  [a-z_0-9]+ \(|Duration|Memory Throughput|L1/TEX Hit|Achieved Occupancy|Registers Per|DRAM Throughput|Compute \(SM\)|L1/TEX Cache Throughput|Mem Busy|Max Bandwidth|Mem Pipes" $O/ncu.txt | head -80
