set -u
# Session 49, call 1: the CUDA suite (new: tiny_qwen3moe_gpu_matches_cpu, tiny_qwen3moe_batch_matches_cpu,
# moe_verify_rows_equal_decoding_one_by_one, hidden_states_match_the_cpu); embeddings from
# `mens serve --backend cuda` against `--backend cpu` on the synthetic 0.5B; then Qwen3-Coder-30B-A3B's
# shape (`mens synth --shape 30b-a3b`, random weights): mens's decode and prefill on the GPU beside
# llama.cpp's CUDA build (when carried in .device/llama-cuda), and the server with four slots, with and
# without --spec ngram: the same greedy texts alone, together and speculating.
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens cuda-test; do un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-49
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do un "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
if ls .device/llama-cuda/*.xz >/dev/null 2>&1; then
  mkdir -p $B/llama
  for f in .device/llama-cuda/*.xz; do un "$f" "$B/llama/$(basename "$f" .xz)"; chmod +x "$B/llama/$(basename "$f" .xz)"; done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/state.txt
m=$M/synth-0.5b.gguf
$B/mens synth --shape 0.5b -o $m > /dev/null 2>&1
( time $B/mens synth --shape 30b-a3b -o $M/synth-30b-a3b.gguf ) > $O/synth-30b.txt 2>&1 &
SYNTH=$!
if [ "${SKIP_SUITE:-0}" != 1 ]; then
  MENS_CUDA_MODEL=$m timeout 420 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
  grep -E "test result|FAILED|panicked|qwen3moe|hidden|verify of 9" $O/tests.log | head -30 | tee $O/summary.txt
fi
# Embeddings: the CUDA server's vectors against the CPU server's.
$B/mens serve -m $m --backend cuda --parallel 2 -c 2048 --port 8311 > $O/serve-emb-cuda.log 2>&1 &
E1=$!
$B/mens serve -m $m --backend cpu --parallel 2 -c 2048 --port 8312 > $O/serve-emb-cpu.log 2>&1 &
E2=$!
for i in $(seq 1 120); do grep -q serving $O/serve-emb-cuda.log && grep -q serving $O/serve-emb-cpu.log && break; sleep 1; done
python3 - <<'PY' | tee -a $O/summary.txt
import json, math, urllib.request
def post(port, body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=120).read())
inputs = ["def add(a, b):\n    return a + b\n", "hello world", "x" * 700, "fn main() {}"]
g, c = post(8311, {"input": inputs}), post(8312, {"input": inputs})
cos = [sum(x * y for x, y in zip(a["embedding"], b["embedding"])) for a, b in zip(g["data"], c["data"])]
print("embeddings cuda vs cpu server: tokens", g["usage"]["prompt_tokens"], c["usage"]["prompt_tokens"],
      "cosines", [round(x, 5) for x in cos])
PY
python3 scripts/embed-bench.py --chunks 64 --rounds 2 cuda=http://127.0.0.1:8311 cpu16=http://127.0.0.1:8312 > $O/embed-bench.txt 2>&1
tail -3 $O/embed-bench.txt | tee -a $O/summary.txt
kill $E1 $E2 2>/dev/null; wait $E1 $E2 2>/dev/null
wait $SYNTH; cat $O/synth-30b.txt | tail -4 | tee -a $O/summary.txt
m30=$M/synth-30b-a3b.gguf
for round in ${ROUNDS:-1}; do
  if [ -x "$B/llama/llama-bench" ]; then
    "$B/llama/llama-bench" -m $m30 -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>$O/llama-bench-$round.err \
      | grep -E "pp512|tg128" | sed "s/^/round $round, llama.cpp: /"
  fi
  $B/mens bench -m $m30 --backend cuda --prompt 512 --steps 0 --depth 0,512 --gen 128 --reps 3 --paired 0 -q \
    --json $O/bench-30b-$round.json 2>&1 | grep -E "^\| (TTFT|prefill|tg)|rror|loaded" | sed "s/^/round $round, mens: /"
done | tee $O/bench-30b.txt
# The server on the 30B shape: four prompts alone, then together, then with --spec ngram.
for spec in "" "--spec ngram"; do
  $B/mens serve -m $m30 --backend cuda --parallel 4 -c 8192 --port 8313 $spec > $O/serve-30b.log 2>&1 &
  S=$!
  for i in $(seq 1 300); do grep -q serving $O/serve-30b.log && break; sleep 1; done
  SPEC="$spec" python3 - <<'PY' | tee -a $O/serve-30b.txt
import json, os, time, urllib.request, concurrent.futures as cf
def ask(p):
    body = {"prompt": p, "max_tokens": 96, "temperature": 0}
    r = urllib.request.Request("http://127.0.0.1:8313/v1/completions", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    t = time.time(); j = json.loads(urllib.request.urlopen(r, timeout=300).read()); return j["choices"][0]["text"], time.time() - t, j["usage"]
ps = ["def fib(n):" * 3, "import os\nimport sys\n" * 10, "x = [1, 2, 3]\n" * 20, "hello " * 50]
alone = [ask(p) for p in ps]
with cf.ThreadPoolExecutor(4) as ex: together = list(ex.map(ask, ps))
print(os.environ["SPEC"] or "no spec", "alone == together:", [a[0] == b[0] for a, b in zip(alone, together)],
      "tokens", [a[2]["completion_tokens"] for a in alone], "s alone", [round(a[1], 2) for a in alone],
      "s together", [round(b[1], 2) for b in together])
json.dump([a[0] for a in alone], open(os.environ.get("OUT", "/tmp") + "/texts-" + ("spec" if os.environ["SPEC"] else "plain") + ".json", "w"))
PY
  kill $S; wait $S 2>/dev/null
done
python3 -c "import json,sys; a=json.load(open('$O/texts-plain.json')); b=json.load(open('$O/texts-spec.json')); print('spec texts equal plain:', [x==y for x,y in zip(a,b)])" | tee -a $O/serve-30b.txt
