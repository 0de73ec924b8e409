#!/usr/bin/env bash
# Runs on a machine with an NVIDIA GPU, from the repository root: unpacks the carried CUDA build
# (.device/*.xz, made by scripts/cuda-build.sh), runs the CUDA tests, writes random-weight Q4_K_M
# models with `mens synth` and benchmarks them with `mens bench --backend cuda`.
# Usage: scripts/cuda-device.sh [cpu|ab|defab|envab|ncu|probe|decode|omit|llamaserver|ttft|small64|test|serve|coding|batch|serving|serving64|preempt|pool|poolbudget|prefix|penalties|specdraft|concurrency|families|copy|http|tune|kv|verify|bench|all] [SHAPES (default: 0.5b,1.5b,7b)]
# `decode`: issue 20's side by side (llama-bench, this binary with and without PDL, mens-old).
# `omit`: what each kernel family costs inside the 7B decode graph (MENS_CUDA_OMIT).
# `llamaserver`: issue 15's llama-server against mens serve, same load, same call.
# `defab`: the binary under several sets of NVRTC defines (DEFS): decode and the verify pass.
# `envab`: the same under several sets of environment settings (ENVS).
# `ncu`: Nsight Compute's counters for the decode kernels (NCU_KERNELS, NCU_SKIP, NCU_COUNT).
# `probe`: read bandwidth of a stream-only kernel at the decode kernels' sizes, and of the decode
# matvec's access pattern alone (scripts/bw-probe.cu, built here with nvcc): their ceilings.
# `verify`: speculative decoding's verify pass of K = 1, 2, 4, 8, 16 tokens against one decode step.
# `kv`: decode at depth 8192 on synth 7b with f16, q8_0 and q4_0 caches, the memory plans, the
# batched runner and perplexity on a q8_0 cache.
# `concurrency`: `mens bench --backend cuda --concurrency 1,4,16,64` (the server's batched runner
# without HTTP) on each shape. `families`: the same with the default kernels and with cuBLAS
# (MENS_CUDA_BATCH=cublas), alternating, and the per-kernel profile of each family.
# `batch`: `mens serve --backend cuda --parallel N` under N streaming clients (256 prompt tokens,
# 256 generated each, ignore_eos, greedy) for N = 1, 4, 16, 64 on synth 7b, and N = 64 on the
# other shapes; `mens bench` decode beside it (the N = 1 bar).
# `coding`: structured output, logprobs and tools through `mens serve --backend cuda` (the host
# sampling path), and speculative decoding on the GPU against plain greedy decoding.
# `http`: the batch mode's HTTP load alone, on synth $HTTP_SHAPE (default 7b), for N in $PARALLEL
# (default 16 64). `tune`: the tensor-core matmul under NVRTC defines (MENS_CUDA_DEFINES) on synth
# 7b: TUNE_DEFS (';'-separated sets), TUNE_BATCH (families), TUNE_N (batch sizes).
# Results go to $OUT (or ./cuda-out).
set -uo pipefail
MODE=${1:-all}
SHAPES=${2:-0.5b,1.5b,7b}
OUT=${OUT:-$PWD/cuda-out}
mkdir -p "$OUT"
. scripts/device-setup.sh  # $BIN, $M, LD_LIBRARY_PATH, the PTX cache
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

synth() {
  local m=$M/synth-$1.gguf
  [ -f "$m" ] || "$BIN/mens" synth --shape "$1" -o "$m" >&2
  echo "$m"
}

if [ "$MODE" = cpu ]; then
  # CPU prefill and decode on this machine's host CPU (issue 19): llama-bench built elsewhere from
  # the 0.3.36 sdist with AVX-512 flags and AMX off (.device/llama-bench.xz, its libraries in
  # .device/lib), against mens with AMX tiles and with MENS_NO_AMX=1, at $CPU_THREADS.
  grep -o -w 'amx_int8\|amx_tile\|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ' | tee "$OUT/cpu-flags.txt"; echo
  nproc | tee -a "$OUT/cpu-flags.txt"
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    "$BIN/mens" bench --backend cpu -m "$m" -t 4 --prompt 16 --steps 0 --paired 0 --reps 1 2>&1 | grep "loaded" | tee -a "$OUT/cpu-flags.txt"
    LLAMA_BENCH="$BIN/llama-bench" LD_LIBRARY_PATH="$PWD/.device/lib:${LD_LIBRARY_PATH:-}" MENS_BIN="$BIN/mens" \
      bash scripts/cpu-scaling.sh "$m" "${CPU_THREADS:-4,8,16}" 512 32 2 2>&1 | tee "$OUT/cpu-$s.md"
    # Where a 16-thread prompt pass goes (MENS_CPU_PROFILE=1: time by section).
    MENS_CPU_PROFILE=1 "$BIN/mens" bench -q --backend cpu -m "$m" -t 16 --prompt 512 --steps 0 --paired 0 \
      --reps 1 2>&1 | tail -16 | tee "$OUT/cpu-profile-$s-t16.md"
  done
fi

if [ "$MODE" = test ] || [ "$MODE" = all ]; then
  echo "== CUDA tests"
  mkdir -p "$OUT/dump"
  MENS_CUDA_DUMP="$OUT/dump" MENS_CUDA_MODEL=$(synth 0.5b) "$BIN/cuda-test" --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda-tests.log" | grep -E "rel L2|agreement|SKIP|test result|panicked|FAILED|error" | head -60
  echo "== the model-file check on synth 1.5b"
  MENS_CUDA_MODEL=$(synth 1.5b) "$BIN/cuda-test" model_file --nocapture 2>&1 | tee "$OUT/cuda-tests-1.5b.log" | grep -E "rel L2|agreement|test result|panicked" | head -10
fi

if [ "$MODE" = serve ] || [ "$MODE" = all ]; then
  echo "== mens serve --backend cuda (one slot) and perplexity --backend cuda"
  m=$(synth 0.5b)
  "$BIN/mens" serve --backend cuda -m "$m" --port 8090 --parallel 1 -c 2048 > "$OUT/serve.log" 2>&1 &
  spid=$!
  python3 scripts/serve-check.py --url http://127.0.0.1:8090 --mens "$BIN/mens" --model "$m" 2>&1 | tee "$OUT/serve-check.txt"
  kill $spid; wait $spid 2>/dev/null
  head -c 200000 README.md > /tmp/ppl.txt
  for b in cuda cpu; do
    echo "perplexity --backend $b: $("$BIN/mens" perplexity --backend $b -m "$m" -f /tmp/ppl.txt -c 256 --chunks 4 2>/dev/null | tail -1)"
  done | tee "$OUT/perplexity.txt"
fi

if [ "$MODE" = coding ] || [ "$MODE" = all ]; then
  echo "== structured output, logprobs, tools on the GPU"
  m=$(synth 0.5b)
  "$BIN/mens" serve --backend cuda -m "$m" --port 8091 --parallel 1 -c 2048 > "$OUT/serve-coding.log" 2>&1 &
  spid=$!
  python3 - <<'PY' 2>&1 | tee "$OUT/coding-check.txt"
import json, time, urllib.request
def call(body, path="/v1/chat/completions"):
    req = urllib.request.Request("http://127.0.0.1:8091" + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:8091/health", timeout=2); break
    except Exception:
        time.sleep(0.5)
# Bounded: a random-weight model writes digits until max_tokens when a number may be any length.
schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "b"]}},
          "required": ["n", "tag"], "additionalProperties": False}
ok = 0
for seed in range(5):
    r = call({"messages": [{"role": "user", "content": "json please"}], "max_tokens": 60, "seed": seed,
              "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    t = r["choices"][0]["message"]["content"]
    try:
        v = json.loads(t); ok += isinstance(v["n"], int) and v["tag"] in ("a", "b") and len(v) == 2
    except Exception as e:
        print("invalid:", repr(t[:80]), e)
print(f"json_schema on CUDA (random weights): {ok}/5 valid")
r = call({"messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3})
lp = r["choices"][0]["logprobs"]["content"]
print("logprobs on CUDA:", len(lp), "entries; greedy = top:", all(e["top_logprobs"][0]["token"] == e["token"] for e in lp))
tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"], "additionalProperties": False}}}]
r = call({"messages": [{"role": "user", "content": "call f"}], "max_tokens": 60, "tools": tools, "tool_choice": "required"})
c = r["choices"][0]
print("forced tool call on CUDA:", c["finish_reason"], c["message"].get("tool_calls", [{}])[0].get("function"))
PY
  kill $spid; wait $spid 2>/dev/null
  echo "== speculative decoding on the GPU: output against plain greedy"
  for s in 0.5b 1.5b; do
    m=$(synth $s)
    for p in "def f(x): return x def f(x): return x def f(x):" "the the the the the"; do
      "$BIN/mens" run --backend cuda -m "$m" -p "$p" -n 96 --temp 0 -c 1024 > /tmp/plain.txt 2>/dev/null
      "$BIN/mens" run --backend cuda -m "$m" -p "$p" -n 96 --temp 0 -c 1024 --spec ngram > /tmp/spec.txt 2>/tmp/spec.err
      echo "synth $s, ngram: same text as plain: $(cmp -s /tmp/plain.txt /tmp/spec.txt && echo yes || echo NO); $(grep -E 'speculation|decode' /tmp/spec.err | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/spec-check.txt"
fi

# `start_serve BINARY LOG ARGS…`: `$BIN/BINARY serve ARGS…` in the background, its output in LOG,
# back once it says it is serving (at most 5 minutes); `stop_serve` ends it.
start_serve() {
  local bin=$1 log=$2; shift 2
  "$BIN/$bin" serve "$@" > "$log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 300); do grep -q "serving" "$log" && break; sleep 1; done
}
stop_serve() { kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null; }

llama_load() {  # model, N, json: llama-server -np N under N streaming clients (issue 15's load)
  "$BIN/llama/llama-server" -m "$1" -ngl 99 -fa on -np "$2" -c $(($2 * 1024)) --port 8096 \
    > "$OUT/llama-server-$2.log" 2>&1 &
  local lpid=$!
  for _ in $(seq 300); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8096/health', timeout=2)" 2>/dev/null && break; sleep 1; done
  python3 scripts/load-test.py --url http://127.0.0.1:8096 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
    --temperature 0 --concurrency "$2" --requests 2 --gpu-mem --json "$3" 2>&1 | grep -E "^C=|^\| [0-9]|Error|error"
  kill $lpid; wait $lpid 2>/dev/null
}

serve_load() {  # shape, parallel, clients... ($SERVE_BIN: the binary, default mens)
  local shape=$1 m; m=$(synth "$1"); local n=$2; shift 2
  start_serve "${SERVE_BIN:-mens}" "$OUT/batch-serve.log" --backend cuda -m "$m" --port 8095 --parallel "$n" -c 1024
  grep -E "memory plan|CUDA device" "$OUT/batch-serve.log"
  for c in "$@"; do
    python3 scripts/load-test.py --url http://127.0.0.1:8095 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
      --temperature 0 --concurrency "$c" --requests 2 --gpu-mem --json "$OUT/batch-$shape-$n-$c.json" 2>&1 | grep -E "^C=|Error|error" | sed "s/^/synth $shape, --parallel $n: /"
  done
  stop_serve
}

if [ "$MODE" = small64 ]; then
  # Issue 15's "also the 1.5B and 0.5B at N = 64" alone.
  for s in 1.5b 0.5b; do serve_load $s 64 64; done 2>&1 | tee "$OUT/small64.txt"
fi

if [ "$MODE" = batch ] || [ "$MODE" = all ]; then
  echo "== mens serve --backend cuda (batched): 256-token prompts, 256 tokens each, greedy, ignore_eos"
  for n in 1 4 16 64; do serve_load 7b $n $n; done 2>&1 | tee "$OUT/batch.txt"
  for s in 1.5b 0.5b; do serve_load $s 64 64; done 2>&1 | tee -a "$OUT/batch.txt"
  echo "-- where a step's time goes (MENS_CUDA_PROFILE), synth 7b, batches of 1 to 64"
  MENS_CUDA_PROFILE=both timeout 120 "$BIN/mens" serve --backend cuda -m "$(synth 7b)" --port 8096 --parallel 64 -c 1024 2>&1 \
    | grep -E "profile|mens:   " | head -300 > "$OUT/batch-profile.txt" &
  ppid=$!
  sleep 45; pkill -f "port 8096" ; wait $ppid 2>/dev/null
  grep -E "profile" "$OUT/batch-profile.txt"
  echo "-- one kernel family at every batch size (MENS_CUDA_BATCH=dp4a, =mma)"
  for k in dp4a mma; do for n in 4 16; do MENS_CUDA_BATCH=$k serve_load 7b $n $n | sed "s/^/$k: /"; done; done 2>&1 | tee -a "$OUT/batch.txt"
  "$BIN/mens" bench -m "$(synth 7b)" --backend cuda --prompt 256 --steps 0 --depth 256 --gen 256 --reps 3 -q 2>&1 | tail -12 | tee -a "$OUT/batch.txt"
fi

[ "$MODE" = cpu ] || MENS_CUDA_VERBOSE=1 "$BIN/mens" run --backend cuda -m "$(synth 0.5b)" -p hi -n 1 --temp 0 2>&1 | grep "registers" | sed 's/^mens: kernel //'

if [ "$MODE" = concurrency ] || [ "$MODE" = all ]; then
  for s in ${SHAPES//,/ }; do
    echo "== mens bench --backend cuda --concurrency, synth $s"
    "$BIN/mens" bench -m "$(synth "$s")" --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 \
      --concurrency 1,4,16,64 --concurrency-prompt 256 --gen 256 -q --json "$OUT/concurrency-$s.json" \
      2>&1 | grep -E "sequences together|TTFT|error|Error" | sed "s/^/synth $s: /" | tee -a "$OUT/concurrency.txt"
  done
fi

if [ "$MODE" = ab ]; then
  # The working tree's binary against $BIN/mens-old (carried as .device/mens-old.xz, built from
  # another commit by scripts/cuda-build-old.sh), alternating twice per shape: the verify pass
  # (issue 18) and the batched runner at 1, 2, 4 and 8 sequences (the dp4a kernels); then each
  # binary's per-kernel profile of the dp4a step at every batch size on the last shape.
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    for round in 1 2; do
      for b in mens-old mens; do
        "$BIN/$b" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 \
          --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror" | sed "s/^/synth $s, round $round, $b: /"
        "$BIN/$b" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 \
          --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 \
          | grep -E "sequences together|rror" | sed "s/^/synth $s, round $round, $b: /"
      done
    done
  done | tee "$OUT/ab.txt"
  for b in mens-old mens; do
    MENS_CUDA_BATCH=dp4a MENS_CUDA_PROFILE=1 timeout 200 "$BIN/$b" serve --backend cuda -m "$m" --port 8097 \
      --parallel 16 -c 1024 > "$OUT/ab-profile-$b.txt" 2>&1 &
    ppid=$!
    for _ in $(seq 200); do grep -q "serving" "$OUT/ab-profile-$b.txt" && break; sleep 1; done
    kill $ppid; wait $ppid 2>/dev/null
    grep -E "profile" "$OUT/ab-profile-$b.txt" | head -4
  done
fi

if [ "$MODE" = defab ]; then
  # One binary under several sets of NVRTC defines (DEFS, ';'-separated; default: none against
  # -DNO_PF), in turn, twice per shape: batch-1 decode (tg128 at depth 0 and 512) and the verify
  # pass of K = 1..16 at depth 512 (WHAT: decode, verify or both).
  IFS=';' read -r -a defsets <<< "${DEFS:-;-DNO_PF}"
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    for round in 1 2; do
      for defs in "${defsets[@]}"; do
        if [[ "${WHAT:-decode,verify}" == *decode* ]]; then
          MENS_CUDA_DEFINES="$defs" "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --depth 0,512 \
            --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/synth $s, round $round, defines '$defs': /"
        fi
        if [[ "${WHAT:-decode,verify}" == *verify* ]]; then
          MENS_CUDA_DEFINES="$defs" "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 \
            --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror" | sed "s/^/synth $s, round $round, defines '$defs': /"
        fi
      done
    done
  done | tee "$OUT/defab.txt"
fi

if [ "$MODE" = envab ]; then
  # The same as defab with environment settings instead of NVRTC defines (ENVS, ';'-separated
  # sets of VAR=VALUE words; e.g. ENVS="MENS_CUDA_MQ_FROM=0;" for the dp4a verify against the
  # int8 tensor-core one), plus the batched runner at 1, 2, 4, 8 rows (WHAT: decode, verify, batch).
  IFS=';' read -r -a envsets <<< "${ENVS:-;MENS_CUDA_MQ_FROM=0}"
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    for round in 1 2; do
      for e in "${envsets[@]}"; do
        if [[ "${WHAT:-verify}" == *decode* ]]; then
          env $e "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --depth 0,512 \
            --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/synth $s, round $round, env '$e': /"
        fi
        if [[ "${WHAT:-verify}" == *verify* ]]; then
          env $e "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 \
            --verify 1,2,4,8,16 --verify-depth 512 -q 2>&1 | grep -E "verify|rror" | sed "s/^/synth $s, round $round, env '$e': /"
        fi
        if [[ "${WHAT:-verify}" == *batch* ]]; then
          env $e "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 \
            --concurrency 1,2,4,8 --concurrency-prompt 256 --gen 128 -q 2>&1 \
            | grep -E "sequences together|rror" | sed "s/^/synth $s, round $round, env '$e': /"
        fi
      done
    done
  done | tee "$OUT/envab.txt"
fi

if [ "$MODE" = families ]; then
  # Issue 15: the batched runner (no HTTP) with each kernel family of 16 rows and more, alternating
  # twice per shape (MENS_CUDA_BATCH: unset = the default mix, cublas), then where a 7B step's
  # time goes in each family at each batch size.
  for s in ${SHAPES//,/ }; do
    for round in 1 2; do
      for k in auto cublas; do
        MENS_CUDA_BATCH=$k "$BIN/mens" bench -m "$(synth "$s")" --backend cuda --prompt 16 --steps 0 --reps 1 \
          --paired 0 --concurrency 1,4,16,32,64 --concurrency-prompt 256 --gen 128 -q 2>&1 \
          | grep -E "sequences together|error|Error" | sed "s/^/synth $s, round $round, $k: /"
      done
    done
  done | tee "$OUT/families.txt"
  MENS_CUDA_PROFILE=both timeout 150 "$BIN/mens" serve --backend cuda -m "$(synth 7b)" --port 8096 --parallel 64 -c 1024 \
    > "$OUT/families-profile.txt" 2>&1 &
  ppid=$!
  for _ in $(seq 150); do grep -q "serving" "$OUT/families-profile.txt" && break; sleep 1; done
  kill $ppid; wait $ppid 2>/dev/null
  grep -E "profile" "$OUT/families-profile.txt"
fi

if [ "$MODE" = serving ]; then
  # Issue 15's benchmark alone: mens serve --backend cuda --parallel N under N streaming clients
  # (256 prompt tokens, 256 generated, ignore_eos, greedy) for N = 1, 4, 16, 64 on synth 7b and
  # N = 64 on 1.5b and 0.5b; mens bench decode beside it (the N = 1 bar); the memory plan that
  # --parallel 64 gets without -c.
  echo "== mens serve --backend cuda (batched): 256-token prompts, 256 tokens each, greedy, ignore_eos"
  for n in 1 4 16 64; do serve_load 7b $n $n; done 2>&1 | tee "$OUT/serving.txt"
  for s in 1.5b 0.5b; do serve_load $s 64 64; done 2>&1 | tee -a "$OUT/serving.txt"
  "$BIN/mens" bench -m "$(synth 7b)" --backend cuda --prompt 256 --steps 0 --depth 256 --gen 256 --reps 3 -q 2>&1 \
    | grep -E "^\| tg|^\| prefill" | tee -a "$OUT/serving.txt"
  start_serve mens "$OUT/auto-ctx.log" --backend cuda -m "$(synth 7b)" --port 8097 --parallel 64
  stop_serve
  grep -E "memory plan|serving" "$OUT/auto-ctx.log" | sed "s/^/--parallel 64 without -c: /" | tee -a "$OUT/serving.txt"
fi

if [ "$MODE" = pool ]; then
  # Issue 15's paged KV pool. (1) The CUDA tests of the pool. (2) Serving on synth 7b, the
  # working tree's binary against $BIN/mens-old (per-slot regions), alternating: N = 1, 16, 64.
  # (3, also alone as `poolbudget`) 62 short requests and 2 long ones at once in one pool under
  # --memory-budget, where per-slot regions (64 × 8192 tokens, 29 GB) could not fit; then a
  # budget where the short requests must wait for pages. 0 errors wanted; /metrics' pages
  # during the load.
  echo "== CUDA tests of the pool"
  MENS_CUDA_MODEL=$(synth 0.5b) "$BIN/cuda-test" --test-threads=1 --nocapture shift_kv paged copy_prefix batch_decodes verify_rows \
    2>&1 | tee "$OUT/pool-tests.log" | grep -E "test result|panicked|FAILED|pool|bit for bit" | head -20
  echo "== serving, old (per-slot regions) against new (pages), synth 7b"
  for n in 1 16 64; do
    for b in mens-old mens; do SERVE_BIN=$b serve_load 7b "$n" "$n" | sed "s/^/$b: /"; done
  done 2>&1 | tee "$OUT/pool-ab.txt"
fi
if [ "$MODE" = pool ] || [ "$MODE" = poolbudget ]; then
  m=$(synth 7b)
  for budget in 9G 7G; do
    echo "== --parallel 64 -c 8192 --memory-budget $budget: 62 clients of 256+256 tokens and 2 of 6000+1024 at once"
    start_serve mens "$OUT/pool-$budget.log" --backend cuda -m "$m" --port 8099 --parallel 64 -c 8192 --memory-budget "$budget"
    grep -E "rror" "$OUT/pool-$budget.log"
    grep -E "memory plan" "$OUT/pool-$budget.log"
    python3 scripts/load-test.py --url http://127.0.0.1:8099 --prompt-tokens 6000 --max-tokens 1024 --ignore-eos \
      --temperature 0 --concurrency 2 --requests 1 --json "$OUT/pool-$budget-long.json" > "$OUT/pool-$budget-long.txt" 2>&1 &
    lp=$!
    sleep 2
    python3 scripts/load-test.py --url http://127.0.0.1:8099 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
      --temperature 0 --concurrency 62 --requests 2 --gpu-mem --json "$OUT/pool-$budget-short.json" > "$OUT/pool-$budget-short.txt" 2>&1 &
    sp=$!
    for _ in 1 2 3 4 5 6; do
      sleep 4
      curl -s http://127.0.0.1:8099/metrics | grep -E "^mens_(kv_pages|slots_busy|queue_length)" | tr '\n' ' '; echo
    done
    wait $sp $lp
    grep -E "^C=|rror" "$OUT/pool-$budget-short.txt" | sed "s/^/short: /"
    grep -E "^C=|rror" "$OUT/pool-$budget-long.txt" | sed "s/^/long: /"
    stop_serve
  done 2>&1 | tee "$OUT/pool-budget.txt"
fi

if [ "$MODE" = preempt ]; then
  # Issue 15's pool under growth: 16 clients of 256 prompt tokens and 1024 answer tokens on synth 7b
  # with --memory-budget 7G (about 161 pages): claimed 256 answer tokens at a time, all 16 start,
  # outgrow the pool, and the latest admitted are preempted and resume. 0 errors wanted.
  m=$(synth 7b)
  start_serve mens "$OUT/preempt.log" --backend cuda -m "$m" --port 8099 --parallel 16 -c 8192 --memory-budget 7G
  grep -E "memory plan|rror" "$OUT/preempt.log"
  python3 scripts/load-test.py --url http://127.0.0.1:8099 --prompt-tokens 256 --max-tokens 1024 --ignore-eos \
    --temperature 0 --concurrency 16 --requests 1 2>&1 | grep -E "^C=|rror"
  curl -s http://127.0.0.1:8099/metrics | grep -E "^mens_(preempted_total|kv_pages)"
  stop_serve
fi

if [ "$MODE" = serving64 ]; then
  # The small shapes at N = 64 and the memory plan --parallel 64 gets without -c (issue 15).
  for s in 1.5b 0.5b; do serve_load $s 64 64; done 2>&1 | tee "$OUT/serving64.txt"
  start_serve mens "$OUT/auto-ctx.log" --backend cuda -m "$(synth 7b)" --port 8097 --parallel 64
  stop_serve
  grep -E "memory plan|serving" "$OUT/auto-ctx.log" | sed "s/^/--parallel 64 without -c: /" | tee -a "$OUT/serving64.txt"
fi

if [ "$MODE" = prefix ]; then
  # Issue 15: a prompt prefix another (busy) slot holds is copied, not prefilled. Request B's TTFT
  # with the copy and without (MENS_NO_PREFIX_COPY=1), alternating, synth 7b, 4000-token prefix.
  m=$(synth 7b)
  for round in 1 2; do
    for off in "" 1; do
      MENS_NO_PREFIX_COPY=$off start_serve mens "$OUT/prefix-serve.log" --backend cuda -m "$m" --port 8098 \
        --parallel 2 -c 8192
      python3 scripts/prefix-copy-check.py --url http://127.0.0.1:8098 --prefix-tokens 4000 2>&1 \
        | sed "s/^/synth 7b, round $round, prefix copy $([ -n "$off" ] && echo off || echo on): /"
      stop_serve
    done
  done | tee "$OUT/prefix.txt"
fi

if [ "$MODE" = specdraft ]; then
  # Issue 18: `mens serve --backend cuda --spec draft -md DRAFT` (the draft a second GPU batch):
  # greedy texts against the same server without speculation (scripts/spec-serve-gpu.py), for
  # synth 0.5b drafting itself (every proposal the target's own choice) and the 1.5b target with
  # the 0.5b draft.
  for pair in 0.5b:0.5b 1.5b:0.5b; do
    t=$(synth ${pair%:*}); dm=$(synth ${pair#*:})
    for mode in plain draft; do
      extra=""; [ $mode = draft ] && extra="--spec draft -md $dm --spec-always"
      start_serve mens "$OUT/specdraft-serve.log" --backend cuda -m "$t" --port 8100 --parallel 4 -c 1024 $extra
      python3 scripts/spec-serve-gpu.py http://127.0.0.1:8100 /tmp/specdraft-$mode.json 4 2>&1 | sed "s/^/$pair $mode: /"
      grep -E "draft model|rror" "$OUT/specdraft-serve.log" | head -3
      stop_serve
    done
    python3 -c "import json; a=json.load(open('/tmp/specdraft-plain.json'))['texts']; b=json.load(open('/tmp/specdraft-draft.json'))['texts']; print('$pair: texts equal to plain:', sum(x == y for x, y in zip(a, b)), 'of', len(a))"
  done 2>&1 | tee "$OUT/specdraft.txt"
fi

if [ "$MODE" = penalties ]; then
  # Repetition penalties on the device (the batch's penalize kernel) against plain greedy, and
  # against $BIN/mens-old (a binary from before, carried as .device/mens-old.xz, which copied
  # each penalised slot's logits to the host): synth 7b, --parallel 64, 64 clients.
  m=$(synth 7b)
  for bin in mens mens-old; do
    [ -x "$BIN/$bin" ] || continue
    for pen in "" 1.1; do
      start_serve "$bin" "$OUT/pen-serve.log" --backend cuda -m "$m" --port 8099 --parallel 64 -c 1024
      python3 scripts/load-test.py --url http://127.0.0.1:8099 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
        --temperature 0 --concurrency 64 --requests 2 ${pen:+--repeat-penalty $pen} 2>&1 | grep -E "^C=|rror" \
        | sed "s/^/$bin, repeat_penalty ${pen:-off}: /"
      stop_serve
    done
  done | tee "$OUT/penalties.txt"
fi

if [ "$MODE" = copy ]; then
  # Issue 15: the f16 weight copy for the cuBLAS steps. The batched runner (no HTTP) at 1 to 64
  # rows, alternating twice per shape: the default mix without the copy (MENS_CUDA_F16=0), the
  # default mix with it, and cuBLAS at every batch size with it; then HTTP at --parallel
  # $PARALLEL (default 16 64) on synth 7b with the default mix.
  for s in ${SHAPES//,/ }; do
    for round in 1 2; do
      for cfg in auto:0 auto:1 cublas:1; do
        MENS_CUDA_BATCH=${cfg%:*} MENS_CUDA_F16=${cfg#*:} "$BIN/mens" bench -m "$(synth "$s")" --backend cuda \
          --prompt 16 --steps 0 --reps 1 --paired 0 --concurrency ${COPY_N:-1,2,4,8,16,32,64} \
          --concurrency-prompt 256 --gen 128 -q 2>&1 | grep -E "sequences together|weight copy|rror" \
          | sed "s/^/synth $s, round $round, ${cfg%:*}, copy ${cfg#*:}: /"
      done
    done
  done | tee "$OUT/copy.txt"
  for n in ${PARALLEL:-16 64}; do serve_load 7b "$n" "$n"; done 2>&1 | tee "$OUT/copy-http.txt"
fi

if [ "$MODE" = http ]; then
  # The batch mode's HTTP load alone: synth 7b at --parallel N for N in $PARALLEL (default 16 64).
  for n in ${PARALLEL:-16 64}; do serve_load "${HTTP_SHAPE:-7b}" "$n" "$n" | sed "s/^/${MENS_CUDA_BATCH:-auto}: /"; done 2>&1 | tee -a "$OUT/http.txt"
fi

if [ "$MODE" = tune ]; then
  # Issues 15 and 20: the tensor-core matmul's occupancy and loads in flight (NVRTC defines, see
  # kernels/batch.cu), each setting through the batched runner on synth 7b.
  m=$(synth 7b)
  IFS=';' read -ra tune_defs <<< "${TUNE_DEFS:--DH16_MINB=1;-DH16_MINB=2;;-DH16_MINB=4}"
  for defs in "${tune_defs[@]}"; do
    regs=$(MENS_CUDA_DEFINES="$defs" MENS_CUDA_VERBOSE=1 "$BIN/mens" run --backend cuda -m "$(synth 0.5b)" -p hi -n 1 \
      --temp 0 2>&1 | grep -E "kernel matmul_h16" | sed 's/^mens: kernel //' | tr '\n' ';')
    echo "defines [$defs]: $regs"
    for k in ${TUNE_BATCH:-mma}; do
      MENS_CUDA_DEFINES="$defs" MENS_CUDA_BATCH=$k "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 \
        --reps 1 --paired 0 --concurrency ${TUNE_N:-4,8,16,32,64} --concurrency-prompt 256 --gen 64 -q 2>&1 \
        | grep -E "sequences together|rror" | sed "s/^/  $k: /"
    done
  done 2>&1 | tee "$OUT/tune.txt"
fi

if [ "$MODE" = kv ]; then
  # Issue 21: decode at depth 8192 with an f16, q8_0 and q4_0 cache (K and V alike), alternating
  # twice; then the context that fits, the batched runner and perplexity on a q8_0 cache.
  m=$(synth 7b)
  for round in 1 2; do
    for t in f16 q8_0 q4_0; do
      fl=""; [ $t = f16-flash ] && { fl=flash; t=f16; }
      MENS_CUDA_PREFILL_ATTN=$fl "$BIN/mens" bench -m "$m" --backend cuda --prompt 8192 --steps 0 --reps 1 \
        --paired 0 --depth 0,8192 --gen 128 -ctk $t -ctv $t --md /tmp/kv.md -q >/dev/null 2>/tmp/kv.err \
        || tail -3 /tmp/kv.err
      echo "round $round, cache $t ${fl:+(flash prefill attention)}: $(grep -E '^\| (prefill|tg)' /tmp/kv.md | cut -d'|' -f2,3 | tr '\n' ';')"
    done
  done | tee "$OUT/kv-depth.txt"
  for t in f16 q8_0 q4_0; do
    "$BIN/mens" run --backend cuda -m "$m" -p "x" -n 1 -ctk $t -ctv $t 2>&1 | grep -E "memory plan" | sed "s/^/$t: /"
  done | tee "$OUT/kv-plan.txt"
  "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --reps 1 --paired 0 --concurrency 1,16 \
    --concurrency-prompt 256 --gen 128 -ctk q8_0 -ctv q8_0 -q 2>&1 | tail -6 | tee "$OUT/kv-concurrency.txt"
  m5=$(synth 0.5b)
  head -c 200000 README.md > /tmp/ppl.txt
  for b in cuda cpu; do
    echo "perplexity --backend $b, q8_0 cache: $("$BIN/mens" perplexity --backend $b -m "$m5" -f /tmp/ppl.txt -c 256 --chunks 4 -ctk q8_0 -ctv q8_0 2>/dev/null | tail -1)"
  done | tee "$OUT/kv-perplexity.txt"
fi

if [ "$MODE" = verify ] || [ "$MODE" = all ]; then
  # Issue 18: a verify pass of K tokens (every position's logits) against one decode step.
  for s in ${SHAPES//,/ }; do
    "$BIN/mens" bench -m "$(synth "$s")" --backend cuda --prompt 16 --steps 0 --reps 3 --paired 0 \
      --verify 1,2,4,8,16 --verify-depth 512 -q --json "$OUT/verify-$s.json" 2>&1 | grep -E "verify|rror" | sed "s/^/synth $s: /"
  done | tee "$OUT/verify.txt"
  echo "== speculative decoding on the GPU (the batched verify): output and speed against plain greedy"
  for s in ${SHAPES//,/ }; do
    m=$(synth $s)
    for p in "def f(x): return x def f(x): return x def f(x):" "the the the the the"; do
      "$BIN/mens" run --backend cuda -m "$m" -p "$p" -n 128 --temp 0 -c 1024 > /tmp/plain.txt 2>/tmp/plain.err
      "$BIN/mens" run --backend cuda -m "$m" -p "$p" -n 128 --temp 0 -c 1024 --spec ngram > /tmp/spec.txt 2>/tmp/spec.err
      echo "synth $s, ngram: same text as plain: $(cmp -s /tmp/plain.txt /tmp/spec.txt && echo yes || echo NO); plain: $(grep -E 'decode' /tmp/plain.err | tr '\n' ' '); spec: $(grep -E 'speculation|decode' /tmp/spec.err | tr '\n' ' ')"
    done
  done 2>&1 | tee "$OUT/spec-check.txt"
fi

# llama.cpp's CUDA build, carried as .device/llama-cuda/*.xz (scripts/llamacpp-build.sh --cuda here,
# from the same 0.3.36 sdist; the device has no network and its build does not fit the lease):
# unpacked into $BIN/llama.
if ls .device/llama-cuda/*.xz >/dev/null 2>&1; then
  mkdir -p "$BIN/llama"
  for f in .device/llama-cuda/*.xz; do
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$BIN/llama/$(basename "$f" .xz)"
    chmod +x "$BIN/llama/$(basename "$f" .xz)"
  done
  # Libraries the device may lack (carried in .device/lib), only when it lacks them.
  for b in "$BIN"/llama/*; do
    ldd "$b" | grep -q "lib\(gomp\|ssl\|crypto\).*not found" && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.device/lib"
  done
fi

if [ "$MODE" = omit ]; then
  # Issue 20: what each kernel family costs inside the decode graph (synth 7b, tg128 at depth
  # 512): the step with the family left out (MENS_CUDA_OMIT, output wrong, time right) against
  # the whole step, twice.
  m=$(synth 7b)
  for round in 1 2; do
    for o in none rmsnorm qkv_rope attn_decode attn_output glu ffn_down "LM head"; do
      env MENS_CUDA_OMIT="${o/none/}" "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --depth 512 \
        --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/round $round, without $o: /"
    done
    # Decode attention loading V after the softmax (as before) against with K (the default).
    for d in "-DATTN_V_LATE" ""; do
      MENS_CUDA_DEFINES="$d" "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --depth 0,512,4096 \
        --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/round $round, defines '$d': /"
    done
    # The gate/up kernel's block size (MENS_CUDA_GLU_WARPS: same arithmetic, several blocks an SM).
    for w in 32 16 8 4; do
      MENS_CUDA_GLU_WARPS=$w "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 0 --depth 0,512 \
        --gen 128 --reps 3 --paired 0 -q 2>&1 | grep -E "^\| tg|rror" | sed "s/^/round $round, glu warps $w: /"
    done
  done | tee "$OUT/omit.txt"
fi

if [ "$MODE" = decode ]; then
  # Issue 20: batch-1 decode side by side in one call. The device's copy bandwidth; per shape,
  # llama-bench (-ngl 99 -fa 1 -p 0 -n 128 -d 0,256,512 -r 3), the working tree's binary, the same
  # with MENS_CUDA_PDL=1 and $BIN/mens-old (when carried), alternating twice; then each binary's
  # per-kernel profile of a 7B step at step 512 (time, bytes, GB/s, % of the copy bandwidth).
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    for round in 1 2; do
      if [ -x "$BIN/llama/llama-bench" ]; then
        "$BIN/llama/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 128 -d 0,256,512 -r 3 -o md 2>/dev/null \
          | grep -E "tg128" | sed "s/^/synth $s, round $round, llama.cpp: /"
      fi
      for b in mens mens-pdl1 mens-old; do
        bin=$b env=""
        [ $b = mens-pdl1 ] && bin=mens env="MENS_CUDA_PDL=1"
        [ -x "$BIN/$bin" ] || continue
        env $env "$BIN/$bin" bench -m "$m" --backend cuda --prompt 512 --steps 0 --depth 0,256,512 --gen 128 \
          --reps 3 --paired 0 -q --json "$OUT/decode-$s-$round-$b.json" 2>&1 | grep -E "^\| (TTFT|prefill|tg)|rror" \
          | sed "s/^/synth $s, round $round, $b: /"
      done
    done
  done | tee "$OUT/decode.txt"
  for b in mens mens-old; do
    [ -x "$BIN/$b" ] || continue
    "$BIN/$b" bench -m "$(synth 7b)" --backend cuda --prompt 16 --steps 512 --reps 1 --paired 0 -q --profile \
      --md "$OUT/profile-7b-$b.md" >/dev/null 2>&1
    echo "== $b"; grep -E "^\||Kernels" "$OUT/profile-7b-$b.md" | tail -14
  done
fi

if [ "$MODE" = llamaserver ]; then
  # Issue 15's benchmark side by side: llama-server (-ngl 99 -fa on -np N -c N×1024, continuous
  # batching) and mens serve --backend cuda --parallel N on synth 7b, the same load (N streaming
  # clients, 256 random-token prompts, 256 tokens each, ignore_eos, greedy), N in $PARALLEL
  # (default 1 4 16 64).
  m=$(synth 7b)
  for n in ${PARALLEL:-1 4 16 64}; do
    llama_load "$m" "$n" "$OUT/llama-server-7b-$n.json" | sed "s/^/synth 7b, llama-server -np $n: /"
    start_serve mens "$OUT/batch-serve.log" --backend cuda -m "$m" --port 8095 --parallel "$n" -c 1024
    python3 scripts/load-test.py --url http://127.0.0.1:8095 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
      --temperature 0 --concurrency "$n" --requests 2 --gpu-mem --json "$OUT/mens-serve-7b-$n.json" 2>&1 \
      | grep -E "^C=|^\| [0-9]|Error|error" | sed "s/^/synth 7b, mens serve --parallel $n: /"
    stop_serve
  done | tee "$OUT/llamaserver.txt"
fi

if [ "$MODE" = ttft ]; then
  # Time to first token under a burst (issue 15): N = $PARALLEL (default 64) clients at once on
  # synth 7b, 256-token prompts, 256 tokens each; mens with prompt chunks packed into shared passes
  # (default) and a pass per prompt (MENS_CUDA_PACK=0), alternating, $ROUNDS rounds (default 2);
  # also stepK: packed with --step-tokens K; then llama-server once at each N (unless SKIP_LLAMA
  # is set). VARIANTS picks among packed, single and stepK (default: packed single step4096).
  m=$(synth 7b)
  for r in $(seq "${ROUNDS:-2}"); do
    for n in ${PARALLEL:-64}; do
      for v in ${VARIANTS:-packed single step4096}; do
        case $v in
          packed) env=""; extra="" ;;
          single) env="MENS_CUDA_PACK=0"; extra="" ;;
          step*) env=""; extra="--step-tokens ${v#step}" ;;
        esac
        # shellcheck disable=SC2086
        env $env "$BIN/mens" serve --backend cuda -m "$m" --port 8095 --parallel "$n" -c 1024 $extra \
          > "$OUT/ttft-serve-$v.log" 2>&1 &
        SERVE_PID=$!
        for _ in $(seq 300); do grep -q "serving" "$OUT/ttft-serve-$v.log" && break; sleep 1; done
        [ "$r" = 1 ] && grep -E "memory plan" "$OUT/ttft-serve-$v.log" | sed "s/^/$v: /"
        # WARM=1: eight short requests first (what the burst then finds already loaded).
        [ -n "${WARM:-}" ] && python3 scripts/load-test.py --url http://127.0.0.1:8095 --prompt-tokens 256 --max-tokens 4 \
          --ignore-eos --temperature 0 --concurrency 8 --requests 1 >/dev/null 2>&1
        python3 scripts/load-test.py --url http://127.0.0.1:8095 --prompt-tokens 256 --max-tokens 256 --ignore-eos \
          --temperature 0 --concurrency "$n" --requests 2 --gpu-mem --json "$OUT/ttft-$v-$n-$r.json" 2>&1 \
          | grep -E "^C=|Error|error" | sed "s/^/round $r, mens $v, N = $n: /"
        stop_serve
      done
    done
  done | tee "$OUT/ttft.txt"
  [ -n "${SKIP_LLAMA:-}" ] || for n in ${PARALLEL:-64}; do
    llama_load "$m" "$n" "$OUT/ttft-llama-server-$n.json" | grep -v "^|" | sed "s/^/llama-server -np $n: /"
  done | tee -a "$OUT/ttft.txt"
fi

if [ "$MODE" = ncu ]; then
  # Hardware counters of the decode kernels (Nsight Compute, where the machine's runtime lets it
  # read them; --clock-control none leaves the clocks alone): synth $SHAPES (first), the kernels
  # matching NCU_KERNELS, NCU_COUNT launches after NCU_SKIP. Throughput, occupancy, warp stalls.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  m=$(synth "${SHAPES%%,*}")
  "$NCU" --clock-control none -k "regex:${NCU_KERNELS:-matvec_glu|attn_decode|^matvec$|qkv_rope|rmsnorm}" \
    --launch-skip "${NCU_SKIP:-400}" --launch-count "${NCU_COUNT:-12}" --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    "$BIN/mens" bench -m "$m" --backend cuda --prompt 16 --steps 64 --paired 0 --reps 1 -q > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
    "$OUT/ncu.txt" | head -200
fi

if [ "$MODE" = probe ]; then
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$NVCC" -O3 -arch=sm_90 scripts/bw-probe.cu -o /tmp/bw-probe && /tmp/bw-probe | tee "$OUT/bw-probe.txt" && \
    /tmp/bw-probe rows | tee "$OUT/bw-probe-rows.txt"
fi

if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  for s in ${SHAPES//,/ }; do
    m=$(synth "$s")
    echo "== mens bench --backend cuda, synth $s"
    "$BIN/mens" bench -m "$m" --backend cuda --prompt 512,2048,8192 --steps 512 --compare \
      --depth 0,512 --gen 128 --reps 3 -q --profile --md "$OUT/bench-$s.md" --json "$OUT/bench-$s.json" \
      2>/tmp/bench-$s.err || tail -5 /tmp/bench-$s.err
  done
fi
[ -f "$OUT/cuda-tests.log" ] && grep -E "rel L2 median|worst step|GPU prefill vs|test result|panicked" "$OUT/cuda-tests.log"
