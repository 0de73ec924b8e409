#!/usr/bin/env python3
"""Time to first token of a request whose prompt prefix another slot holds (issue 15's prefix
sharing, done by copying cache rows): start `mens serve --parallel 2` fresh, send request A (the
shared prefix and a tail, streaming, kept busy with ignore_eos), and once its first token arrives
send request B (the same prefix, another tail) to the empty slot; print B's TTFT and cached tokens.
Run it against a server started with and without MENS_NO_PREFIX_COPY=1 (loopback only).

Usage: scripts/prefix-copy-check.py --url http://127.0.0.1:8080 --prefix-tokens 1500
"""
import argparse
import json
import random
import threading
import time
import urllib.request


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--prefix-tokens", type=int, default=1500)
    ap.add_argument("--busy-tokens", type=int, default=400, help="tokens request A generates")
    a = ap.parse_args()
    if not a.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        raise SystemExit("loopback addresses only")
    rng = random.Random(7)
    prefix = [rng.randrange(1000, 30000) for _ in range(a.prefix_tokens)]
    first = threading.Event()

    def busy():
        body = {"prompt": prefix + [rng.randrange(1000, 30000) for _ in range(16)], "stream": True,
                "max_tokens": a.busy_tokens, "ignore_eos": True, "temperature": 0}
        with post(a.url, body) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    first.set()

    t = threading.Thread(target=busy)
    t.start()
    if not first.wait(600):
        raise SystemExit("request A gave no token")
    body = {"prompt": prefix + [rng.randrange(1000, 30000) for _ in range(16)], "stream": True,
            "max_tokens": 2, "temperature": 0, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    ttft, cached = None, None
    with post(a.url, body) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            ev = json.loads(line[6:])
            if ttft is None and ev.get("choices"):
                ttft = time.monotonic() - t0
            if ev.get("usage"):
                cached = ev["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    t.join()
    print(f"prefix {a.prefix_tokens} tokens: B's TTFT {ttft * 1000:.0f} ms, cached tokens {cached}")


if __name__ == "__main__":
    main()
