#!/usr/bin/env bash
# embed-reference.sh: llama-server's embeddings, the oracle of crates/mens/tests/embed.rs.
#  - crates/mens/tests/data/embeddings.json: the real 0.5B, --pooling mean and last, four inputs
#    (three short, the first 1,600 characters of scripts/spec-bench.py), L2-normalised vectors;
#  - crates/mens/tests/data/arch/qwen3-embed.json: the tiny Qwen3-Embedding-style file (`mens synth
#    --tiny qwen3-embed`: pooling_type last, add_eos_token), its pooling taken from the file, three
#    inputs, the vectors not normalised (embd_normalize -1), with the file's FNV-1a hash.
# Needs a built mens (target/release/mens or $MENS) and llama-server (scripts/llamacpp-build.sh
# llama-server), and the 0.5B in $MENS_MODELS (default .cache/models).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
mens=${MENS:-$root/target/release/mens}
server=${LLAMA_SERVER:-$HOME/.cache/mens/llamacpp/build/bin/llama-server}
models=${MENS_MODELS:-$root/.cache/models}
port=${PORT:-8391}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

start() {  # start MODEL ARGS…: llama-server on $port, waiting for its health
  "$server" -m "$@" -c 2048 -b 2048 -ub 2048 -t 2 --port "$port" > "$tmp/server.log" 2>&1 &
  for _ in $(seq 120); do curl -sf "localhost:$port/health" > /dev/null && return; sleep 1; done
  echo "llama-server did not start:" >&2; cat "$tmp/server.log" >&2; exit 1
}
stop() { kill %1; wait %1 2>/dev/null || true; }

cd "$root"
python3 - > "$tmp/inputs.json" <<'PY'
import json
print(json.dumps(["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
                  "The quick brown fox jumps over the lazy dog.", "fn main() { println!(\"hi\"); }",
                  open("scripts/spec-bench.py").read()[:1600]]))
PY
for pool in mean last; do
  start "$models/qwen2.5-coder-0.5b.gguf" --embeddings --pooling $pool
  python3 -c "import json,sys; print(json.dumps({'input': json.load(open(sys.argv[1]))}))" "$tmp/inputs.json" > "$tmp/req.json"
  curl -sf "localhost:$port/v1/embeddings" -H 'Content-Type: application/json' -d @"$tmp/req.json" > "$tmp/$pool.json"
  stop
done
python3 - "$tmp" crates/mens/tests/data/embeddings.json <<'PY'
import json, sys
tmp, dst = sys.argv[1:]
out = {"source": "llama-server (llama-cpp-python 0.3.36 sdist, CPU build) -m qwen2.5-coder-0.5b.gguf --embeddings --pooling POOLING -c 2048 -b 2048 -ub 2048; POST /v1/embeddings {input}: L2-normalised vectors, rounded to 6 significant digits (scripts/embed-reference.sh)",
       "inputs": json.load(open(f"{tmp}/inputs.json"))}
for p in ["mean", "last"]:
    d = json.load(open(f"{tmp}/{p}.json"))
    out[p] = {"prompt_tokens": d["usage"]["prompt_tokens"],
              "vectors": [[float("%.6g" % x) for x in e["embedding"]] for e in sorted(d["data"], key=lambda e: e["index"])]}
json.dump(out, open(dst, "w"))
print(dst)
PY

"$mens" synth --tiny qwen3-embed -o "$tmp/q3e.gguf"
start "$tmp/q3e.gguf" --embeddings
python3 - "$tmp/q3e.gguf" "$port" crates/mens/tests/data/arch/qwen3-embed.json <<'PY'
import json, sys, urllib.request
gguf, port, dst = sys.argv[1:]
def post(path, body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r).read())
h = 0xcbf29ce484222325
for b in open(gguf, "rb").read():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
texts = ["def add(a, b):\n    return a + b\n", "hello world", "x"]
out = {"gguf_fnv1a64": "%016x" % h,
       "source": "llama-server (llama-cpp-python 0.3.36 sdist) --embeddings (the file's pooling), POST /embedding {content, embd_normalize: -1} and /v1/embeddings' usage (scripts/embed-reference.sh)",
       "inputs": texts,
       "prompt_tokens": [post("/v1/embeddings", {"input": t})["usage"]["prompt_tokens"] for t in texts],
       "vectors": [post("/embedding", {"content": t, "embd_normalize": -1})[0]["embedding"][0] for t in texts]}
json.dump(out, open(dst, "w"))
print(dst, out["prompt_tokens"])
PY
stop
