#!/usr/bin/env bash
# cpu-scaling.sh MODEL.gguf THREADS[,THREADS…] [PROMPT] [GEN] [REPS]: CPU prefill (ppPROMPT) and
# decode (tgGEN) at each thread count, llama-bench and `mens bench` alternating (mens twice: its
# default kernels, AMX tiles for prompts where the CPU has them, and with MENS_NO_AMX=1), one
# Markdown table. llama.cpp comes from scripts/llamacpp-build.sh (explicit x86-64 flags, AMX off),
# or $LLAMA_BENCH (a llama-bench built so elsewhere, for a machine without network). Run on an
# idle machine.
set -euo pipefail
model=${1:?usage: cpu-scaling.sh MODEL.gguf THREADS[,THREADS…] [PROMPT] [GEN] [REPS]}
threads=${2:?thread counts}
prompt=${3:-512}
gen=${4:-64}
reps=${5:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
bench=${LLAMA_BENCH:-$cache/build/bin/llama-bench}
mens=${MENS_BIN:-$here/target/release/mens}
[ -x "$bench" ] || "$here/scripts/llamacpp-build.sh" llama-bench >/dev/null
for f in amx_int8 avx512_vnni avx2; do grep -q -w "$f" /proc/cpuinfo && { echo "best CPU feature seen: $f"; break; }; done
grep -m1 "model name" /proc/cpuinfo
echo "model $(basename "$model"), pp$prompt and tg$gen, $reps reps (tokens/s)"
echo "| threads | llama.cpp pp | mens pp | mens pp, no AMX | pp ratio | llama.cpp tg | mens tg | mens tg, no AMX | tg ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
ll() { "$bench" -m "$model" -t "$1" -p "$2" -n "$3" -r "$reps" -o json 2>/dev/null |
  python3 -c "import json,sys; print('%.1f' % json.load(sys.stdin)[0]['avg_ts'])"; }
mb() { "$mens" bench -q --backend cpu -m "$model" -t "$1" --prompt "$2" --steps 0 --gen "$3" --depth 0 --reps "$reps" \
  --json /tmp/cpu-scaling-mens.json >/dev/null 2>&1
  python3 -c "import json; j=json.load(open('/tmp/cpu-scaling-mens.json'))
print('%.1f %.1f' % (j['prefill'][0]['tokens_per_s'], j['results'][0]['tokens_per_s']))"; }
for t in ${threads//,/ }; do
  lp=$(ll "$t" "$prompt" 0)
  read -r mp mt < <(mb "$t" "$prompt" "$gen")
  read -r fp ft < <(MENS_NO_AMX=1 mb "$t" "$prompt" "$gen")
  lt=$(ll "$t" 0 "$gen")
  python3 -c "import sys; t,lp,mp,fp,lt,mt,ft=sys.argv[1:]; lp,mp,fp,lt,mt,ft=map(float,(lp,mp,fp,lt,mt,ft))
print(f'| {t} | {lp} | {mp} | {fp} | {mp/lp:.2f} | {lt} | {mt} | {ft} | {mt/lt:.2f} |')" \
    "$t" "$lp" "$mp" "$fp" "$lt" "$mt" "$ft"
done
