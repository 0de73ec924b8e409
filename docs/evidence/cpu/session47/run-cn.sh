#!/bin/bash
# usage: run-cn.sh ENGINE(mens|llama) LOG ; runs the Continue CLI twice (cold server, then warm) against a fresh server
set -u
ENGINE=$1; LOG=$2; M=/work/main/.cache/models/qwen2.5-coder-1.5b.gguf
pkill -f "mens serve" ; pkill -f llama-server; pkill -f proxy.py; sleep 1
if [ $ENGINE = mens ]; then
  /work/main/target/release/mens serve -m $M --port 8012 -c 8192 --parallel 1 -t 2 > /tmp/cnw/srv.log 2>&1 &
else
  ~/.cache/mens/llamacpp/build/bin/llama-server -m $M --port 8012 -c 8192 -np 1 -t 2 --jinja > /tmp/cnw/srv.log 2>&1 &
fi
for i in $(seq 60); do curl -sf localhost:8012/health >/dev/null && break; sleep 1; done
python3 /tmp/cnw/proxy.py 8014 http://127.0.0.1:8012 $LOG > /tmp/cnw/proxy.log 2>&1 &
sleep 1
cd /tmp/cnw/proj && export HOME=/tmp/cnw/home
for run in cold warm; do
  t0=$(date +%s.%N)
  out=$(timeout 600 /tmp/cn/node_modules/.bin/cn -p "What does stats.py do? Read it first." --config /tmp/cnw/config.yaml --auto 2>&1 | tail -3)
  t1=$(date +%s.%N)
  echo "$ENGINE $run $(echo "$t1 - $t0" | bc) s :: $out"
done
