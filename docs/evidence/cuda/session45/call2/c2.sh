set -u
# The server's new APIs on the GPU (mens serve --backend cuda): Ollama's (the official ollama
# Python client, protocol mode on random weights) and llama-server's native /completion, /props,
# /apply-template; the same binary's CPU server beside it as the reference.
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
for f in mens; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache; mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$MENS_CUDA_CACHE/$(basename "$f" .xz)"; done
export CUDA_CACHE_PATH=/tmp/jit-45
$B/mens synth --shape 0.5b -o /tmp/mens-models/synth-0.5b.gguf > /dev/null 2>&1
python3 -m venv /tmp/venv && /tmp/venv/bin/pip install --quiet --no-index --find-links .device/wheels ollama jsonschema 2>&1 | tail -2
date +%T > $O/state.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $O/state.txt
m=/tmp/mens-models/synth-0.5b.gguf
for be in cuda cpu; do
  port=$([ $be = cuda ] && echo 8301 || echo 8302)
  $B/mens serve -m $m --backend $be --parallel 4 -c 2048 --api-key k --port $port > $O/serve-$be.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do grep -q "serving" $O/serve-$be.log && break; sleep 1; done
  timeout 240 /tmp/venv/bin/python crates/mens-cli/tests/ollama_compat.py http://127.0.0.1:$port k --any-model > $O/ollama-$be.txt 2>&1; echo "ollama client on $be: rc=$?" | tee -a $O/summary.txt
  tail -1 $O/ollama-$be.txt | tee -a $O/summary.txt
  { curl -s -H Content-Type:application/json -H "Authorization: Bearer k" localhost:$port/completion -d '{"prompt":"def fib(n):","n_predict":8,"temperature":0}'; echo;
    curl -s -H Content-Type:application/json -H "Authorization: Bearer k" localhost:$port/completion -d '{"prompt":"def fib(n):","n_predict":4,"temperature":0,"stream":true}'; echo;
    curl -s -H "Authorization: Bearer k" localhost:$port/props | head -c 300; echo;
    curl -s -H Content-Type:application/json -H "Authorization: Bearer k" localhost:$port/api/chat -d '{"messages":[{"role":"user","content":"hi"}],"options":{"temperature":0,"num_predict":3}}'; echo;
  } > $O/native-$be.txt 2>&1
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
done
grep -h "loaded\|serving" $O/serve-*.log >> $O/summary.txt
date +%T >> $O/state.txt
