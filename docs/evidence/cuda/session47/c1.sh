set -u
# Session 47: the CUDA suite on the final source (the sampler's forced tokens keep a slot's
# sampling on the host: DeviceSampling), and the reasoning budget and llama-server's route names
# under `mens serve --backend cuda` (and cpu beside it) on the synth 0.5B with a template that opens
# <think> (budget_check.py).
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens cuda-test; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
export CUDA_CACHE_PATH=/tmp/jit-47
$B/mens synth --shape 0.5b -o /tmp/mens-models/synth-0.5b.gguf > /dev/null 2>&1
date +%T > $O/state.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $O/state.txt
MENS_CUDA_MODEL=/tmp/mens-models/synth-0.5b.gguf timeout 300 $B/cuda-test --test-threads=1 --nocapture > $O/tests.log 2>&1
grep -E "test result|FAILED|panicked" $O/tests.log | head -12 | tee $O/summary.txt
m=/tmp/mens-models/synth-0.5b.gguf
for be in cuda cpu; do
  port=$([ $be = cuda ] && echo 8301 || echo 8302)
  $B/mens serve -m $m --backend $be --parallel 2 -c 2048 --port $port > $O/serve0-$be.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do grep -q "serving" $O/serve0-$be.log && break; sleep 1; done
  python3 - $port > /tmp/opened.jinja <<'PY'
import json, re, sys, urllib.request
t = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/props"))["chat_template"]
# The generation prompt's assistant turn (its newline written out or escaped) opens <think>.
o, n = re.subn(r"(<\|im_start\|>assistant)(\\n|\n)(')", r"\1\2<think>\2\3", t)
assert n == 1, "no assistant turn to open"
print(o, end="")
PY
  kill $pid; wait $pid 2>/dev/null
  $B/mens serve -m $m --backend $be --parallel 2 -c 2048 --port $port --chat-template-file /tmp/opened.jinja > $O/serve-$be.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do grep -q "serving" $O/serve-$be.log && break; sleep 1; done
  timeout 240 python3 docs/evidence/cuda/session47/budget_check.py http://127.0.0.1:$port > $O/budget-$be.txt 2>&1; echo "budget check on $be: rc=$?" | tee -a $O/summary.txt
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
done
date +%T >> $O/state.txt
