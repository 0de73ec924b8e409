#!/usr/bin/env python3
"""Inter-token latency of a decoding stream while another client sends long prompts (loopback only,
bounded in count and time; standard library only).

One client streams a long completion and records when each token arrives; meanwhile a second client
sends --prompts requests of --prompt-tokens tokens each (max_tokens 1), one after another. Reports the
gaps between the first client's tokens: p50, p99, max, and the count over 1 s.

    python3 scripts/itl-test.py --url http://127.0.0.1:8080 --prompt-tokens 4000 --prompts 3
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def stream_times(host, port, max_tokens, out, stop):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = {"prompt": "def quicksort(a):", "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stop": ["\x00never"]}
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    buf = b""
    while not stop.is_set():
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: ") and ev != b"data: [DONE]":
                d = json.loads(ev[6:])
                if d["choices"] and d["choices"][0].get("text"):
                    out.append(time.perf_counter())
    conn.close()


def long_prompts(host, port, n, tokens, started):
    # About four tokens per " wNNN" word in Qwen's vocabulary; the server reports the exact count.
    counts, durations = [], []
    for k in range(n):
        # A different start each time, so that no prompt is served from the cache.
        text = f"request {k}:" + "".join(f" w{(i * (k + 3)) % 997}" for i in range(tokens // 4))
        conn = http.client.HTTPConnection(host, port, timeout=600)
        started.append(time.perf_counter())
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": text, "max_tokens": 1}),
                     headers={"Content-Type": "application/json"})
        r = json.loads(conn.getresponse().read())
        if "usage" not in r:
            sys.exit(f"long prompt failed: {r}")
        counts.append(r["usage"]["prompt_tokens"])
        durations.append(time.perf_counter() - started[-1])
        conn.close()
    return counts, durations


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loopback only")
    times, stop, started = [], threading.Event(), []
    t = threading.Thread(target=stream_times, args=(u.hostname, u.port, a.max_tokens, times, stop))
    t.start()
    while len(times) < 5:
        time.sleep(0.05)
    counts, durations = long_prompts(u.hostname, u.port, a.prompts, a.prompt_tokens, started)
    stop.set()
    t.join(timeout=60)
    # Gaps while the long prompts were being prefilled.
    t0 = started[0]
    gaps = [b - a_ for a_, b in zip(times, times[1:]) if b >= t0]
    gaps.sort()
    res = {
        "prompt_tokens": counts,
        "long_prompt_s": [round(d, 2) for d in durations],
        "gaps": len(gaps),
        "p50_ms": 1e3 * statistics.median(gaps),
        "p99_ms": 1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "max_ms": 1e3 * gaps[-1],
        "over_1s": sum(g > 1 for g in gaps),
    }
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
