#!/usr/bin/env python3
"""Greedy rename requests against a running `mens serve` (loopback): completion tokens per second of
request time, three requests (the first prefills the prompt, the next reuse it), then the
speculation counters of /metrics.

    python3 scripts/spec-serve-check.py http://127.0.0.1:8096 LABEL
"""
import json, sys, time, urllib.request
url = sys.argv[1]
rename = "Rename the variable `total` to `acc` and return the whole function:\n\n```python\ndef summarize(items):\n    total = 0\n    for item in items:\n        if item.value > 0:\n            total += item.value * item.weight\n        else:\n            total -= item.penalty\n    if total > 100:\n        total = 100\n    return total\n```"
body = {"messages": [{"role": "user", "content": rename}], "max_tokens": 120, "temperature": 0}
rates = []
for i in range(3):
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}), timeout=300).read())
    dt = time.perf_counter() - t0
    rates.append(r["usage"]["completion_tokens"] / dt)
m = urllib.request.urlopen(url + "/metrics").read().decode()
acc = [l for l in m.splitlines() if l.startswith("mens_spec_")]
print(sys.argv[2], "tokens/s (completion tokens / request time):", [round(x, 2) for x in rates], acc)
