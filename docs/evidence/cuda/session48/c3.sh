set -u
# Session 48, call 3 (never ran: no device could be started again): embeddings on the GPU, with
# cuda-hidden-untested.patch applied (`Logits::Hidden` in CudaSession and CudaBatch). The
# CUDA suite (hidden_states_match_the_cpu is new), then `mens serve --backend cuda` and `--backend
# cpu` on the synthetic 0.5B answering the same /v1/embeddings request: the vectors' cosines; then
# scripts/embed-bench.py against both (64 chunks, two rounds; the CPU server on the host's 16 cores).
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-47
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
m=/tmp/mens-models/synth-0.5b.gguf
[ -f $m ] || $B/mens synth --shape 0.5b -o $m > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/state.txt
MENS_CUDA_MODEL=$m timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked|hidden states" $O/tests.log | head -12 | tee $O/summary.txt
for be in cuda cpu; do
  port=$([ $be = cuda ] && echo 8311 || echo 8312)
  $B/mens serve -m $m --backend $be --parallel 2 -c 2048 --port $port > $O/serve-$be.log 2>&1 &
done
for i in $(seq 1 120); do grep -q serving $O/serve-cuda.log && grep -q serving $O/serve-cpu.log && break; sleep 1; done
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
      "cosines", [round(x, 5) for x in cos], "norms", [round(math.sqrt(sum(x * x for x in d["embedding"])), 4) for d in g["data"]])
PY
python3 scripts/embed-bench.py --chunks 64 --rounds 2 cuda=http://127.0.0.1:8311 cpu16=http://127.0.0.1:8312 > $O/embed-bench.txt 2>&1
tail -3 $O/embed-bench.txt | tee -a $O/summary.txt
kill %1 %2 2>/dev/null; wait 2>/dev/null
