#!/usr/bin/env bash
# bench-vs-llamacpp.sh MODEL.gguf [THREADS] [PROMPTS] [DEPTHS] [REPS]: llama-bench and `mens bench`
# on the same file, same settings (defaults: prompts 512,2048,8192; 128 generated tokens at depths
# 0,256,512; 3 reps), one Markdown table with the ratio mens / llama.cpp per row.
# llama.cpp is obtained by package name and built by scripts/llamacpp-build.sh (explicit x86-64 flags,
# AMX off) into $MENS_CACHE/llamacpp (default ~/.cache/mens/llamacpp). Nothing of llama.cpp is
# committed. Run on an otherwise idle machine.
set -euo pipefail
model=${1:?usage: bench-vs-llamacpp.sh MODEL.gguf [THREADS] [PROMPTS] [DEPTHS] [REPS]}
threads=${2:-2}
prompts=${3:-512,2048,8192}
depths=${4:-0,256,512}
reps=${5:-3}
version=0.3.36
cache=${MENS_CACHE:-$HOME/.cache/mens}/llamacpp
bench="$cache/build/bin/llama-bench"
here=$(cd "$(dirname "$0")/.." && pwd)
mens=${MENS_BIN:-$here/target/release/mens}

[ -x "$bench" ] || "$here/scripts/llamacpp-build.sh" llama-bench >/dev/null
[ -x "$mens" ] || (cd "$here" && cargo build --release)

out=$(mktemp -d)
# Prefill and decode as separate llama-bench runs: -d would otherwise apply to every prompt test too.
"$bench" -m "$model" -t "$threads" -p "$prompts" -n 0 -r "$reps" -o json > "$out/llama-pp.json"
"$bench" -m "$model" -t "$threads" -p 0 -n 128 -d "$depths" -r "$reps" -o json > "$out/llama-tg.json"
"$mens" bench -q -m "$model" -t "$threads" --prompt "$prompts" --steps 0 --gen 128 --depth "$depths" \
  --reps "$reps" --json "$out/mens.json" > /dev/null
python3 - "$out" "$model" "$threads" "$reps" <<'PY'
import json, sys, os
out, model, threads, reps = sys.argv[1:5]
llama = json.load(open(f"{out}/llama-pp.json")) + json.load(open(f"{out}/llama-tg.json"))
mens = json.load(open(f"{out}/mens.json"))
ll = {(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)): r for r in llama}
print(f"model {os.path.basename(model)}, {threads} threads, {reps} reps (mens: median, llama.cpp: mean)")
print("| test | mens tok/s | llama.cpp tok/s | mens / llama.cpp | mens TTFT ms | llama.cpp TTFT ms |")
print("|---|---|---|---|---|---|")
for p in mens["prefill"]:
    o = ll.get((p["n_prompt"], 0, 0))
    ratio = f'{p["tokens_per_s"] / o["avg_ts"]:.2f}' if o else "–"
    ot = f'{o["avg_ts"]:.1f}' if o else "–"
    oms = f'{o["avg_ns"] / 1e6:.0f}' if o else "–"
    print(f'| pp{p["n_prompt"]} | {p["tokens_per_s"]:.1f} | {ot} | {ratio} | {p["ttft_ms"]:.0f} | {oms} |')
for r in mens["results"]:
    o = ll.get((0, r["n_gen"], r["n_depth"]))
    ratio = f'{r["tokens_per_s"] / o["avg_ts"]:.2f}' if o else "–"
    ot = f'{o["avg_ts"]:.1f}' if o else "–"
    print(f'| tg{r["n_gen"]} @ d{r["n_depth"]} | {r["tokens_per_s"]:.1f} | {ot} | {ratio} | | |')
PY
