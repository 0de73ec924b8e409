#!/usr/bin/env bash
# Speculation in the server, every mode against plain decoding: a server per mode (1.5B target by
# default, M= to change it), three greedy rename requests each (scripts/spec-serve-check.py), two
# rounds alternating the modes. Run from the repository root after a release build.
M=${M:-.cache/models/qwen2.5-coder-1.5b.gguf}; D=.cache/models/qwen2.5-coder-0.5b.gguf
for round in 1 2; do
  for mode in plain ngram draft ngram-always draft-always; do
    case $mode in plain) extra=();; ngram) extra=(--spec ngram);; draft) extra=(--spec draft -md $D);;
      ngram-always) extra=(--spec ngram --spec-always);; draft-always) extra=(--spec draft -md $D --spec-always);; esac
    target/release/mens serve -m $M -c 2048 --parallel 1 -t 2 --port 8096 "${extra[@]}" > /tmp/srv-$mode.log 2>&1 &
    pid=$!
    for i in $(seq 120); do curl -s http://127.0.0.1:8096/health >/dev/null && break; sleep 0.5; done
    python3 scripts/spec-serve-check.py http://127.0.0.1:8096 "round $round $mode"
    kill $pid; wait $pid 2>/dev/null
  done
done
