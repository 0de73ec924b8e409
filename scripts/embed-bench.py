#!/usr/bin/env python3
"""Embedding throughput as a code indexer sees it: N chunks of this repo's Rust source (about
800 characters each) in one POST /v1/embeddings, timed at the client (the answer's arrival),
against one or more servers, alternating between them.

Usage: python3 scripts/embed-bench.py [--chunks 32] [--rounds 3] [--check-batch] NAME=URL [NAME=URL ...]
e.g.   python3 scripts/embed-bench.py mens=http://127.0.0.1:8080 llama=http://127.0.0.1:8081
Prints each round's seconds and tokens/s (the server's usage.prompt_tokens over the wall time),
and the medians; with two servers, the cosine of their vectors for the same chunk (min, median).
--check-batch instead compares each server's vectors for the chunks sent together with those it
gives each chunk sent alone (a server's batching must not change an input's vector).
"""
import glob
import json
import statistics
import sys
import time
import urllib.request


def chunks(n, size=800):
    out = []
    for path in sorted(glob.glob("crates/mens/src/*.rs")):
        text = open(path, encoding="utf-8").read()
        for i in range(0, len(text) - size, size):
            out.append(text[i:i + size])
            if len(out) == n:
                return out
    return out


def post(url, body):
    req = urllib.request.Request(url + "/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        v = json.loads(r.read())
    return time.perf_counter() - t, v


def main():
    args = sys.argv[1:]
    n, rounds = 32, 3
    if "--chunks" in args:
        i = args.index("--chunks"); n = int(args[i + 1]); del args[i:i + 2]
    if "--rounds" in args:
        i = args.index("--rounds"); rounds = int(args[i + 1]); del args[i:i + 2]
    check = "--check-batch" in args
    args = [a for a in args if a != "--check-batch"]
    servers = [a.split("=", 1) for a in args]
    texts = chunks(n)
    if check:
        cos = lambda u, w: sum(x * y for x, y in zip(u, w))
        for name, url in servers:
            _, v = post(url, {"input": texts, "encoding_format": "float"})
            together = [d["embedding"] for d in sorted(v["data"], key=lambda d: d["index"])]
            alone = [post(url, {"input": [t], "encoding_format": "float"})[1]["data"][0]["embedding"] for t in texts]
            print(f"{name}: together vs alone, cosine per chunk:", [round(cos(a, b), 4) for a, b in zip(together, alone)])
        return
    body = {"input": texts, "encoding_format": "float"}
    # One warm-up request each (first-use costs are not the indexer's steady state).
    for _, url in servers:
        post(url, {"input": texts[:2]})
    times = {name: [] for name, _ in servers}
    vecs, tokens = {}, {}
    for r in range(rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        for name, url in order:
            secs, v = post(url, body)
            tokens[name] = v["usage"]["prompt_tokens"]
            vecs[name] = [d["embedding"] for d in sorted(v["data"], key=lambda d: d["index"])]
            times[name].append(secs)
            print(f"round {r + 1} {name}: {secs:.2f} s, {tokens[name] / secs:.1f} tokens/s")
    for name, _ in servers:
        m = statistics.median(times[name])
        print(f"{name}: {len(texts)} chunks, {tokens[name]} tokens, median {m:.2f} s, {tokens[name] / m:.1f} tokens/s")
    if len(servers) == 2:
        a, b = (vecs[s[0]] for s in servers)
        cos = [sum(x * y for x, y in zip(u, w)) for u, w in zip(a, b)]
        print(f"cosine {servers[0][0]} vs {servers[1][0]}: min {min(cos):.5f}, median {statistics.median(cos):.5f}")


if __name__ == "__main__":
    main()
