#!/bin/bash
# usage: run-aider.sh ENGINE(mens|llama) LOG: a fresh server, then aider adds a function to stats.py (whole edit format, greedy)
set -u
ENGINE=$1; LOG=$2; M=/work/main/.cache/models/qwen2.5-coder-1.5b.gguf
pkill -f "mens serve"; pkill -f llama-server; pkill -f proxy.py; sleep 1
if [ $ENGINE = mens ]; then
  /work/main/target/release/mens serve -m $M --port 8012 -c 8192 --parallel 1 -t 2 > /tmp/aw/srv.log 2>&1 &
else
  ~/.cache/mens/llamacpp/build/bin/llama-server -m $M --port 8012 -c 8192 -np 1 -t 2 --jinja > /tmp/aw/srv.log 2>&1 &
fi
for i in $(seq 60); do curl -sf localhost:8012/health >/dev/null && break; sleep 1; done
python3 /tmp/cnw/proxy.py 8014 http://127.0.0.1:8012 $LOG > /tmp/aw/proxy.log 2>&1 &
sleep 1
mkdir -p /tmp/aw/w && cp /work/main/docs/evidence/cpu/session47/stats.py /tmp/aw/w/stats.py && cd /tmp/aw/w && export HOME=/tmp/aw/home
t0=$(date +%s.%N)
timeout 600 /tmp/aider-venv/bin/aider --model openai/qwen2.5-coder-1.5b --openai-api-base http://127.0.0.1:8014/v1 \
  --openai-api-key x --no-git --yes-always --no-check-update --analytics-disable --no-show-model-warnings \
  --message "Add a function mode(xs) that returns the most common value." stats.py > /tmp/aw/aider-$ENGINE.txt 2>&1
t1=$(date +%s.%N)
echo "$ENGINE $(echo "$t1 - $t0" | bc) s"; cat stats.py; python3 -c "import stats; print('mode:', stats.mode([1,2,2,3]))"
