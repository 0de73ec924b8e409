# llama.vscode's /infill request (its createRequestPayload's fields, greedy here) on the 0.5B, the
# cursor in a method body, with n_indent 8 (the cursor line's indentation) and without (0),
# alternating; wall time per request from curl, tokens from the answer.
# LLAMA=DIR (llama.cpp's bin directory): the same against llama-server, the peer.
set -u
M=${1:-.cache/models/qwen2.5-coder-0.5b.gguf}
if [ -n "${LLAMA:-}" ]; then
  $LLAMA/llama-server -m $M --port 8128 -c 2048 -t 2 -np 1 > /tmp/n-indent-serve.log 2>&1 &
else
  ./target/release/mens serve -m $M --port 8128 -c 2048 -t 2 > /tmp/n-indent-serve.log 2>&1 &
fi
pid=$!; sleep 8
body() { python3 -c "import json,sys; print(json.dumps({'input_prefix': 'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n', 'input_suffix': '\n', 'input_extra': [], 'prompt': '        ', 'n_predict': 128, 'top_k': 40, 'top_p': 0.99, 'temperature': 0, 'samplers': ['top_k', 'top_p', 'infill'], 'cache_prompt': True, 'n_indent': int(sys.argv[1]), 't_max_prompt_ms': 500, 't_max_predict_ms': 10000}))" $1; }
for round in 1 2 3 4 5; do for n in 0 8; do
  r=$(curl -s -w ' %{time_total}' -H Content-Type:application/json localhost:8128/infill -d "$(body $n)")
  echo "$r" | python3 -c "import json,sys; s=sys.stdin.read(); j,t=s.rsplit(' ',1); v=json.loads(j); print('n_indent=$n round=$round tokens=%d stop=%s wall_ms=%.0f content=%r' % (v['tokens_predicted'], v['stop_type'], float(t)*1000, v['content'][:40]))"
done; done
kill $pid
