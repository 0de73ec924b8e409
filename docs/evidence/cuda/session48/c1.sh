set -u
# Session 48: the CUDA suite and session 47's serve checks (reasoning budget, route names) on this
# session's binary (session 47's script), then the embedding routes under --backend cuda: a clear
# 501 (hidden states are computed on the CPU backend only).
bash docs/evidence/cuda/session47/c1.sh
B=/tmp/mens-bin; m=/tmp/mens-models/synth-0.5b.gguf
$B/mens serve -m $m --backend cuda --parallel 2 -c 2048 --port 8303 > $OUT/serve-embed.log 2>&1 &
pid=$!
for i in $(seq 1 120); do grep -q "serving" $OUT/serve-embed.log && break; sleep 1; done
for path in /v1/embeddings /embedding /api/embed; do
  code=$(curl -s -o $OUT/embed-body.txt -w '%{http_code}' localhost:8303$path -H 'Content-Type: application/json' -d '{"input": "hello"}')
  echo "embeddings $path on cuda: HTTP $code $(head -c 200 $OUT/embed-body.txt)" | tee -a $OUT/summary.txt
done
kill $pid; wait $pid 2>/dev/null
