set -u
# Session 52, call 3: session 49's server check after the RoPE fix (session 49 call 2, before it:
# the 30B-A3B shape's fourth prompt parted alone / together / speculating): fresh servers for each
# case on the 30B-A3B shape, alone, together (packing on and off) and with --spec ngram; `mens run`
# with and without --spec ngram. Everything goes to c3.txt. (No tests: call 1 ran them.)
O=$OUT; B=/tmp/mens-bin; M=/tmp/mens-models; mkdir -p $B $M
un() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
for f in mens; do [ -x $B/$f ] && continue; un .device/$f.xz $B/$f; chmod +x $B/$f; done
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64 MENS_CUDA_CACHE=/tmp/mens-cuda-cache CUDA_CACHE_PATH=/tmp/jit-52
mkdir -p $MENS_CUDA_CACHE
for f in .device/ptx/*.ptx.xz; do g="$MENS_CUDA_CACHE/$(basename "$f" .xz)"; [ -f "$g" ] || un "$f" "$g"; done
L=$O/c3.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $L
[ -f $M/synth-30b-a3b.gguf ] || $B/mens synth --shape 30b-a3b -o $M/synth-30b-a3b.gguf > /dev/null 2>&1 &
SYN=$!
wait $SYN
ask() {  # port, mode (alone|together), tag
  PORT=$1 MODE=$2 TAG=$3 python3 - <<'PY'
import json, os, urllib.request, concurrent.futures as cf
port = os.environ["PORT"]
def ask(p):
    body = {"prompt": p, "max_tokens": 96, "temperature": 0}
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=300).read())["choices"][0]["text"]
ps = ["def fib(n):" * 3, "import os\nimport sys\n" * 10, "x = [1, 2, 3]\n" * 20, "hello " * 50]
if os.environ["MODE"] == "alone":
    out = [ask(p) for p in ps]
else:
    with cf.ThreadPoolExecutor(4) as ex: out = list(ex.map(ask, ps))
print("TEXTS", os.environ["TAG"], json.dumps(out))
PY
}
serve_case() {  # model, tag, mode, extra args...
  local m=$1 tag=$2 mode=$3; shift 3
  env ${ENVS:-} $B/mens serve -m $m --backend cuda --parallel 4 -c 8192 --port 8313 "$@" > $O/serve.log 2>&1 &
  local S=$!
  for i in $(seq 1 300); do grep -q serving $O/serve.log && break; sleep 1; done
  ask 8313 $mode $tag
  kill $S; wait $S 2>/dev/null
}
for s in 30b-a3b; do
  m=$M/synth-$s.gguf
  serve_case $m $s-plain-alone alone
  ENVS="MENS_CUDA_PACK=0" serve_case $m $s-plain-together-nopack together
  serve_case $m $s-plain-together together
  serve_case $m $s-spec-alone alone --spec ngram
  for spec in "" "--spec ngram"; do
    echo "RUN $s ${spec:-plain}: $($B/mens run -m $m --backend cuda -n 96 --temp 0 $spec -p "$(python3 -c 'print("hello " * 50)')" 2>/dev/null | python3 -c 'import sys,json; print(json.dumps(sys.stdin.read()))')"
  done
done >> $L 2>&1
python3 - "$L" <<'PY' | tee -a $L
import json, sys
t = {}
for line in open(sys.argv[1]):
    if line.startswith("TEXTS "):
        _, tag, js = line.split(" ", 2); t[tag] = json.loads(js)
for s in ["30b-a3b"]:
    a = t.get(f"{s}-plain-alone")
    for other in ["plain-together-nopack", "plain-together", "spec-alone"]:
        b = t.get(f"{s}-{other}")
        if a and b:
            print(s, "alone vs", other, [x == y for x, y in zip(a, b)],
                  "first difference at chars", [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), -1) for x, y in zip(a, b)])
PY
