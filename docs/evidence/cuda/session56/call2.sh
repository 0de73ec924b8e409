#!/usr/bin/env bash
# Session 56, the trimmed call (less device time left): the q8k probe alone, five rounds, the 7B's
# gate (Q4_KR) and LM head (Q6_KR) shapes. Run from the repository root with .device and
# bench/cuda-q8k/probe.ptx carried.
set -u
O=${OUT:-/tmp/out}
. scripts/device-setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
(cd bench/cuda-q8k && ROUNDS=5 PYTHONUNBUFFERED=1 timeout 170 python3 -u probe.py probe.ptx \
   q4kr:18944x3584 q6kr:152064x3584) > $O/probe.txt 2>&1
cat $O/probe.txt | grep -vE '^$'
