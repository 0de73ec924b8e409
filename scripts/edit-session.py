#!/usr/bin/env python3
"""A scripted editing session against two running `mens serve` (or llama-server) instances: a Python
file of about 2,000 tokens, then N fill-in-the-middle requests (`/infill`, llama.vscode's shape), each
after a one-line edit at a random place with the cursor on the edited line. Each request goes to the
cold server (a fresh `user` per request and `cache_prompt: false`, so nothing is reused) and then to the warm one (one editor,
cache reuse on); time to first token is measured by the client, greedy completions are compared.
Standard library only; loopback only.

    python3 scripts/edit-session.py --cold http://127.0.0.1:8092 --warm http://127.0.0.1:8091 [-n 20]
"""
import argparse, json, random, statistics, sys, time, urllib.parse, urllib.request


def make_file(rng, n_funcs=60):
    words = ["alpha", "beta", "gamma", "delta", "count", "total", "items", "value", "index", "result",
             "buffer", "limit", "offset", "name", "path", "size", "state", "token", "score", "weight"]
    out = ["import math", "import os", "from collections import defaultdict", ""]
    for i in range(n_funcs):
        a, b, c = rng.sample(words, 3)
        out += [f"def {a}_{b}_{i}({a}, {b}):",
                f'    """Return the {c} of {a} and {b}."""',
                f"    {c} = {a} * {rng.randint(2, 9)} + {b}",
                f"    if {c} > {rng.randint(10, 99)}:",
                f"        {c} -= {rng.randint(1, 9)}",
                f"    return {c}", ""]
    return out


def infill(url, lines, cur, user=None, n_predict=16):
    prefix = "\n".join(lines[:cur]) + "\n"
    suffix = "\n" + "\n".join(lines[cur + 1:]) + "\n"
    body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": [], "prompt": lines[cur],
            "n_predict": n_predict, "top_k": 1, "temperature": 0, "stream": True, "cache_prompt": True,
            "samplers": ["top_k"], "t_max_predict_ms": 60000}
    if user:
        # Cold: mens reuses a cache only within one `user`; llama-server only with cache_prompt.
        body["user"] = user
        body["cache_prompt"] = False
    req = urllib.request.Request(url + "/infill", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, timings = None, "", {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev.get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            text += ev.get("content", "")
            if ev.get("stop"):
                timings = ev.get("timings", {})
    if ttft is None:
        ttft = time.perf_counter() - t0
    return ttft, text, timings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", required=True)
    ap.add_argument("--warm", required=True)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--spread", type=int, default=0,
                    help="the cursor moves at most this many lines per edit (0: anywhere in the file)")
    a = ap.parse_args()
    for u in (a.cold, a.warm):
        if urllib.parse.urlparse(u).hostname not in ("127.0.0.1", "localhost"):
            sys.exit("loopback only")
    rng = random.Random(a.seed)
    lines = make_file(rng)
    # Warm-up: the warm server sees the file once (an editor opening it).
    cur = len(lines) // 2
    infill(a.warm, lines, cur)
    cold_t, warm_t, same, reused, prefilled = [], [], 0, [], []
    for i in range(a.n):
        if a.spread:
            cur = min(max(4, cur + rng.randint(-a.spread, a.spread)), len(lines) - 3)
        else:
            cur = rng.randrange(4, len(lines) - 2)
        lines[cur] = lines[cur].rstrip() + f"  # edit {i}" if lines[cur].strip() else f"    # note {i}"
        tc, text_c, _ = infill(a.cold, lines, cur, user=f"cold-{i}")
        tw, text_w, tim = infill(a.warm, lines, cur)
        cold_t.append(tc)
        warm_t.append(tw)
        same += text_c == text_w
        reused.append(tim.get("cache_n", 0))
        prefilled.append(tim.get("prompt_n", 0))
        print(f"edit {i:2d} line {cur:3d}: cold {tc*1e3:8.0f} ms  warm {tw*1e3:7.0f} ms  "
              f"reused {tim.get('cache_n')} prefilled {tim.get('prompt_n')}  same={text_c == text_w}",
              flush=True)
    p50c, p50w = statistics.median(cold_t), statistics.median(warm_t)
    print(json.dumps({"requests": a.n, "cold_ttft_p50_ms": round(p50c * 1e3), "warm_ttft_p50_ms": round(p50w * 1e3),
                      "warm_over_cold": round(p50w / p50c, 4), "same_completion": same,
                      "reused_tokens_p50": statistics.median(reused),
                      "prefilled_tokens_p50": statistics.median(prefilled),
                      "prompt_tokens": reused[-1] + prefilled[-1]}))


if __name__ == "__main__":
    main()
