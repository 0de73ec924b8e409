#!/usr/bin/env python3
"""Greedy completions from a running `mens serve`: N concurrent requests of repetitive code-like
prompts (where prompt lookup proposes), printed as JSON, with the server's speculation counters.
Run it against a server with and without --spec and compare the texts: they must be equal.
Usage: spec-serve-gpu.py URL OUT.json [CONCURRENCY]"""
import json, sys, threading, time, urllib.request

url, out = sys.argv[1], sys.argv[2]
conc = int(sys.argv[3]) if len(sys.argv) > 3 else 4
for _ in range(600):
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.5)
prompts = [f"def f{i}(x):\n    return x + {i}\n" * 4 + f"def f{i}(x):" for i in range(2 * conc)]
texts = [None] * len(prompts)

def run(i):
    body = {"prompt": prompts[i], "max_tokens": 96, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    texts[i] = json.loads(urllib.request.urlopen(req, timeout=300).read())["choices"][0]["text"]

t0 = time.time()
for start in range(0, len(prompts), conc):
    ts = [threading.Thread(target=run, args=(i,)) for i in range(start, min(start + conc, len(prompts)))]
    [t.start() for t in ts]
    [t.join() for t in ts]
wall = time.time() - t0
metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
spec = [l for l in metrics.splitlines() if "spec" in l and not l.startswith("#")]
json.dump({"texts": texts, "wall_s": wall, "spec_metrics": spec}, open(out, "w"), indent=1)
print(f"{len(texts)} requests, {conc} at a time, {wall:.2f} s; {' '.join(spec)}")
