#!/usr/bin/env python3
"""Load test for `mens serve` (loopback only, bounded in count and time; standard library only).

For each concurrency C in --concurrency, C client threads each send --requests streaming chat
completions one after another. Reports requests/s, completion tokens/s (total over all streams),
tokens/s per stream, p50/p99 time to first content token, errors, and the server's RSS before and
after (--pid) or the GPU's memory in use (--gpu-mem).

    python3 scripts/load-test.py --url http://127.0.0.1:8080 --pid $(pgrep -f 'mens serve') \
        --concurrency 1,2,4,8 --requests 20 --max-tokens 32

With --prompt-tokens N each request is a /v1/completions prompt of N random token ids (different
for every request, so no server can reuse another's prompt), as the GPU serving benchmark does:

    python3 scripts/load-test.py --prompt-tokens 256 --max-tokens 256 --ignore-eos --temperature 0 \
        --concurrency 1,4,16,64 --requests 2 --gpu-mem
"""
import random
import subprocess
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Rust function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "Write a SQL query that counts orders per customer.",
    "Write a bash one-liner that counts lines in all .py files.",
    "Write a JavaScript function that debounces another function.",
    "What does the `yield` keyword do in Python?",
    "Write a C function that computes the length of a string.",
]


def rss_kib(pid):
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def one_request(host, port, path, body, timeout):
    """One streaming request: (time to first content token s, completion tokens, total s)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft = None
    tokens = None
    chunks = 0
    done = False
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                done = True
                continue
            v = json.loads(data)
            if "error" in v:
                raise RuntimeError(f"stream error: {v['error']}")
            if v.get("usage"):
                tokens = v["usage"]["completion_tokens"]
            for c in v.get("choices", []):
                text = c.get("delta", {}).get("content") or c.get("text")
                if text:
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    if tokens is None:
        tokens = chunks  # a server that sends no usage: one chunk per token
    return ttft if ttft is not None else time.perf_counter() - t0, tokens, time.perf_counter() - t0


def gpu_mem_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except Exception:  # noqa: BLE001 - no GPU: not reported
        return None


def run(url, concurrency, requests, max_tokens, timeout, opts):
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("load-test: loopback addresses only")
    results, errors = [], []
    lock = threading.Lock()

    def client(ci):
        for r in range(requests):
            body = {
                "max_tokens": max_tokens,
                "temperature": opts.temperature,
                "seed": ci * 1000 + r,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if opts.ignore_eos:
                body["ignore_eos"] = True
            if opts.repeat_penalty is not None:
                body["repeat_penalty"] = opts.repeat_penalty
            if opts.prompt_tokens:
                rng = random.Random(concurrency * 100000 + ci * 1000 + r)
                body["prompt"] = [rng.randrange(1000, 30000) for _ in range(opts.prompt_tokens)]
                path = "/v1/completions"
            else:
                body["messages"] = [{"role": "user", "content": PROMPTS[(ci * requests + r) % len(PROMPTS)]}]
                path = "/v1/chat/completions"
            try:
                res = one_request(host, port, path, body, timeout)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in results)
    toks = sum(r[1] for r in results)

    def pct(p):
        if not ttfts:
            return float("nan")
        return ttfts[min(len(ttfts) - 1, int(round(p / 100 * (len(ttfts) - 1))))]

    per_stream = [r[1] / (r[2] - r[0]) for r in results if r[2] > r[0] and r[1] > 1]
    return {
        "per_stream_tokens_per_s": statistics.median(per_stream) if per_stream else float("nan"),
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(errors),
        "error_samples": errors[:3],
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "completion_tokens": toks,
        "tokens_per_s": toks / wall,
        "ttft_p50_ms": pct(50) * 1000,
        "ttft_p99_ms": pct(99) * 1000,
        "mean_request_s": statistics.mean(r[2] for r in results) if results else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, help="server pid, for RSS before/after")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=20, help="requests per client (≤ 1000)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="random token-id prompts of this length (/v1/completions)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--ignore-eos", action="store_true", help="generate max-tokens every time")
    ap.add_argument("--repeat-penalty", type=float, help="llama.cpp's repeat_penalty on every request")
    ap.add_argument("--gpu-mem", action="store_true", help="report nvidia-smi memory.used after each level")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    if a.requests > 1000 or max(levels) > 64:
        sys.exit("load-test: at most 1000 requests per client and 64 clients")
    rss0 = rss_kib(a.pid)
    rows = []
    for c in levels:
        r = run(a.url, c, a.requests, a.max_tokens, a.timeout, a)
        r["rss_after_mib"] = (rss_kib(a.pid) or 0) / 1024
        r["gpu_mem_mib"] = gpu_mem_mib() if a.gpu_mem else None
        rows.append(r)
        print(
            f"C={c}: {r['requests']} requests, {r['errors']} errors, {r['requests_per_s']:.2f} req/s, "
            f"{r['tokens_per_s']:.1f} tok/s ({r['per_stream_tokens_per_s']:.1f} per stream), TTFT p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms",
            file=sys.stderr,
        )
    rss1 = rss_kib(a.pid)
    print("| concurrent streams | requests | errors | requests/s | total tokens/s | tokens/s per stream | TTFT p50 ms | TTFT p99 ms | server RSS after (MiB) | GPU memory (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['requests_per_s']:.2f} | "
            f"{r['tokens_per_s']:.1f} | {r['per_stream_tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | "
            f"{r['ttft_p99_ms']:.0f} | {r['rss_after_mib']:.0f} | {r['gpu_mem_mib'] if r['gpu_mem_mib'] is not None else '-'} |"
        )
    if rss0 is not None:
        print(f"\nserver RSS before: {rss0 / 1024:.0f} MiB, after: {(rss1 or 0) / 1024:.0f} MiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rss_before_kib": rss0, "rss_after_kib": rss1, "max_tokens": a.max_tokens,
                       "requests_per_client": a.requests, "levels": rows}, f, indent=2)
    if any(r["errors"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
