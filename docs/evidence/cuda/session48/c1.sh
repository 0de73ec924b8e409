set -u
# Session 48: the CUDA suite and session 47's serve checks (reasoning budget, route names) on this
# session's binary (session 47's script), then the embedding routes under --backend cuda: a clear
# 501 (hidden states are computed on the CPU backend only). Call 2 and after: BUDGET=48 runs this
# session's budget check (every request cold) in place of session 47's; SKIP_SUITE=1 skips the suite.
O=$OUT; B=/tmp/mens-bin; mkdir -p $B /tmp/mens-models
if [ "${SKIP_SUITE:-0}" = 1 ]; then
  sed -e 's/^MENS_CUDA_MODEL=.*cuda-test.*$/echo suite skipped > $O\/tests.log/' \
      -e "s#docs/evidence/cuda/session47/budget_check.py#docs/evidence/cuda/session${BUDGET:-47}/budget_check.py#" \
      docs/evidence/cuda/session47/c1.sh > /tmp/c1-47.sh
else
  sed -e "s#docs/evidence/cuda/session47/budget_check.py#docs/evidence/cuda/session${BUDGET:-47}/budget_check.py#" \
      docs/evidence/cuda/session47/c1.sh > /tmp/c1-47.sh
fi
bash /tmp/c1-47.sh
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-47
m=/tmp/mens-models/synth-0.5b.gguf
$B/mens serve -m $m --backend cuda --parallel 2 -c 2048 --port 8303 > $O/serve-embed.log 2>&1 &
pid=$!
for i in $(seq 1 120); do grep -q "serving" $O/serve-embed.log && break; sleep 1; done
for path in /v1/embeddings /embedding /api/embed; do
  code=$(curl -s -o $O/embed-body.txt -w '%{http_code}' localhost:8303$path -H 'Content-Type: application/json' -d '{"input": "hello"}')
  echo "embeddings $path on cuda: HTTP $code $(head -c 200 $O/embed-body.txt)" | tee -a $O/summary.txt
done
kill $pid; wait $pid 2>/dev/null
