#!/usr/bin/env python3
"""Speculative decoding on the workload in bench/spec/tasks.jsonl (10 code edits, 10 fresh
functions, each a chat request): for every task, `mens run --chat` greedy with each mode, the modes
alternating within a task; decode tokens/s of each mode against plain decoding, acceptance, and
whether the text equals plain decoding's.

    python3 scripts/spec-bench.py [--target M.gguf] [--draft D.gguf] [--modes plain,ngram,draft]
                                  [-n 160] [-t 2] [--only id,id] [--reps R] [--json out.json]

Run from the repository root after `cargo build --release`. Prints a Markdown table.

With --llama DIR (llama.cpp's bin directory, scripts/llamacpp-build.sh), the peer runs beside mens in
the same loop: modes `llama` (no speculation), `llama-ngram` (`--spec-type ngram-simple
--spec-draft-n-max 16`) and `llama-draft` (`--spec-type draft-simple -md DRAFT --spec-draft-n-max 8`),
one llama-server each (started here, loopback, same threads and context), a chat request per task
(also `llama-ngram-mod`: `--spec-type ngram-mod`, its defaults);
their speed-ups are against `llama`. Add them to --modes.
"""
import argparse, atexit, json, math, os, re, subprocess, sys, tempfile, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--target", default=".cache/models/qwen2.5-coder-1.5b.gguf")
ap.add_argument("--draft", default=".cache/models/qwen2.5-coder-0.5b.gguf")
ap.add_argument("--tasks", default="bench/spec/tasks.jsonl")
ap.add_argument("--modes", default="plain,ngram,draft")
ap.add_argument("--bin", default="target/release/mens")
ap.add_argument("-n", type=int, default=160)
ap.add_argument("-t", type=int, default=2)
ap.add_argument("--only", default="")
ap.add_argument("--extra", default="", help="more flags for every speculating run, e.g. --spec-always")
ap.add_argument("--json", default="")
ap.add_argument("--llama", default="", help="llama.cpp bin directory: enables the llama* modes")
ap.add_argument("--reps", type=int, default=1,
                help="runs of every (task, mode), the order of the modes reversed each time; a mode's "
                     "figures are the sums over its runs (a shared VM's slow and fast spells then fall "
                     "on every mode alike)")
a = ap.parse_args()

tasks = [json.loads(l) for l in open(a.tasks) if l.strip()]
if a.only:
    keep = set(a.only.split(","))
    tasks = [t for t in tasks if t["id"] in keep]
modes = a.modes.split(",")
FLAGS = {"plain": [], "ngram": ["--spec", "ngram"], "draft": ["--spec", "draft", "-md", a.draft]}
# NAME:K is mode NAME proposing up to K tokens (--spec-max K), e.g. ngram:16 beside ngram;
# NAME/N looks up suffixes of up to N tokens (--spec-ngram N), e.g. ngram/6.
for m in a.modes.split(","):
    if ":" in m:
        base, k = m.split(":")
        FLAGS[m] = FLAGS[base] + ["--spec-max", k]
    elif "/" in m:
        base, n = m.split("/")
        FLAGS[m] = FLAGS[base] + ["--spec-ngram", n]

# The peer's modes: llama-server flags, and the port each listens on.
LLAMA = {"llama": [], "llama-ngram": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "16"],
         "llama-draft": ["--spec-type", "draft-simple", "-md", a.draft, "--spec-draft-n-max", "8"],
         "llama-ngram-mod": ["--spec-type", "ngram-mod"]}
servers = {}


def base(mode):
    """The mode a mode's speed-up is measured against."""
    return "llama" if mode.startswith("llama") else "plain"


def start_llama(mode, port):
    cmd = [os.path.join(a.llama, "llama-server"), "-m", a.target, "-t", str(a.t), "-c", "2048", "-np", "1",
           "--host", "127.0.0.1", "--port", str(port)] + LLAMA[mode]
    servers[mode] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    sys.exit(f"llama-server for {mode} did not start")


def run_llama(mode, prompt):
    port = servers[mode][1]
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": a.n, "temperature": 0,
            "top_k": 1, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        out = json.load(r)
    t = out["timings"]
    return {"text": out["choices"][0]["message"]["content"], "generated": t["predicted_n"],
            "steps": None, "ms": t["predicted_ms"], "tps": t["predicted_per_second"],
            "proposed": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}


def stop_servers():
    for p, _ in servers.values():
        p.terminate()
    for p, _ in servers.values():
        p.wait(timeout=60)  # gone before whatever is timed next


atexit.register(stop_servers)  # at the end, and on sys.exit or an exception

GEN = re.compile(r"generated (\d+) tokens, decode (\d+) steps, ([\d.]+) ms, ([\d.]+) tokens/s")
SPEC = re.compile(r"speculation: (\d+) tokens proposed, (\d+) accepted")


def run(mode, prompt_file):
    if mode in LLAMA:
        return run_llama(mode, open(prompt_file).read())
    cmd = [a.bin, "run", "-m", a.target, "--chat", "-f", prompt_file, "--temp", "0", "-n", str(a.n),
           "-t", str(a.t), "-c", "2048"] + FLAGS[mode] + (a.extra.split() if mode != "plain" else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    g = GEN.search(p.stderr)
    s = SPEC.search(p.stderr)
    return {"text": p.stdout, "generated": int(g[1]), "steps": int(g[2]), "ms": float(g[3]),
            "tps": float(g[4]), "proposed": int(s[1]) if s else 0, "accepted": int(s[2]) if s else 0}


for i, m in enumerate(m for m in modes if m in LLAMA):
    if not a.llama:
        sys.exit(f"mode {m} needs --llama DIR")
    start_llama(m, 8181 + i)

results = []
with tempfile.TemporaryDirectory() as d:
    for i, task in enumerate(tasks):
        f = os.path.join(d, task["id"] + ".txt")
        open(f, "w").write(task["prompt"])
        r = {}
        for rep in range(a.reps):
            order = modes if (i + rep) % 2 == 0 else modes[::-1]  # alternate which mode runs first
            for m in order:
                x = run(m, f)
                if m not in r:
                    r[m] = x
                    continue
                if x["text"] != r[m]["text"]:
                    sys.exit(f"{task['id']} {m}: run {rep + 1}'s text differs from run 1's")
                for key in ["generated", "steps", "ms", "proposed", "accepted"]:
                    r[m][key] += x[key]
                r[m]["tps"] = r[m]["generated"] / r[m]["ms"] * 1e3
        results.append({"id": task["id"], "kind": task["kind"], **r})
        line = [task["id"], task["kind"]]
        for m in modes:
            x = r[m]
            b = base(m)
            line.append(f"{m} {x['tps']:.2f}" + (f" ({x['tps'] / r[b]['tps']:.2f}x, {x['accepted']}/{x['proposed']})" if m != b and b in r else ""))
        print(" | ".join(line), file=sys.stderr, flush=True)

if a.json:
    json.dump({"args": vars(a), "results": results}, open(a.json, "w"), indent=1)

spec_modes = [m for m in modes if m != base(m)]
bases = [m for m in modes if m == base(m)]
print(f"| task | kind | " + " | ".join(f"{b} tok/s" for b in bases) + " | " + " | ".join(f"{m} tok/s (÷ {base(m)}) | {m} accepted / proposed | {m} text = {base(m)}" for m in spec_modes) + " |")
print("|---|---|" + "---|" * len(bases) + "---|---|---|" * len(spec_modes))
for r in results:
    cells = [r["id"], r["kind"]] + [f"{r[b]['tps']:.2f}" for b in bases]
    for m in spec_modes:
        x = r[m]
        acc = f"{x['accepted']} / {x['proposed']}" + (f" ({100 * x['accepted'] / x['proposed']:.0f}%)" if x["proposed"] else "")
        b = base(m)
        cells += [f"{x['tps']:.2f} ({x['tps'] / r[b]['tps']:.2f}×)", acc, "yes" if x["text"] == r[b]["text"] else "**no**"]
    print("| " + " | ".join(cells) + " |")
print()
for kind in ["edit", "fresh"]:
    rs = [r for r in results if r["kind"] == kind]
    if not rs:
        continue
    for m in spec_modes:
        b = base(m)
        ratios = [r[m]["tps"] / r[b]["tps"] for r in rs]
        # Overall: every generated token over every decode second, as one long session would see it.
        tot = sum(r[m]["generated"] for r in rs) / sum(r[m]["ms"] for r in rs)
        tot_p = sum(r[b]["generated"] for r in rs) / sum(r[b]["ms"] for r in rs)
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        same = sum(r[m]["text"] == r[b]["text"] for r in rs)
        print(f"- {kind}, {m} (÷ {b}): overall {tot / tot_p:.2f}× (geometric mean {geo:.2f}×, min {min(ratios):.2f}×, max {max(ratios):.2f}×); "
              f"accepted {sum(r[m]['accepted'] for r in rs)} of {sum(r[m]['proposed'] for r in rs)}; text equal to {b}'s {same}/{len(rs)}")
    if "plain" in modes and "llama" in modes:
        # mens run ends its output with a newline.
        same = sum(r["plain"]["text"].strip() == r["llama"]["text"].strip() for r in rs)
        print(f"- {kind}: mens's text equal to llama.cpp's (both without speculation) {same}/{len(rs)}")
