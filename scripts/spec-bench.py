#!/usr/bin/env python3
"""Speculative decoding on the workload in bench/spec/tasks.jsonl (10 code edits, 10 fresh
functions, each a chat request): for every task, `mens run --chat` greedy with each mode, the modes
alternating within a task; decode tokens/s of each mode against plain decoding, acceptance, and
whether the text equals plain decoding's.

    python3 scripts/spec-bench.py [--target M.gguf] [--draft D.gguf] [--modes plain,ngram,draft]
                                  [-n 160] [-t 2] [--only id,id] [--json out.json]

Run from the repository root after `cargo build --release`. Prints a Markdown table.
"""
import argparse, json, math, os, re, subprocess, sys, tempfile

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

GEN = re.compile(r"generated (\d+) tokens, decode (\d+) steps, ([\d.]+) ms, ([\d.]+) tokens/s")
SPEC = re.compile(r"speculation: (\d+) tokens proposed, (\d+) accepted")


def run(mode, prompt_file):
    cmd = [a.bin, "run", "-m", a.target, "--chat", "-f", prompt_file, "--temp", "0", "-n", str(a.n),
           "-t", str(a.t), "-c", "2048"] + FLAGS[mode] + (a.extra.split() if mode != "plain" else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    g = GEN.search(p.stderr)
    s = SPEC.search(p.stderr)
    return {"text": p.stdout, "generated": int(g[1]), "steps": int(g[2]), "ms": float(g[3]),
            "tps": float(g[4]), "proposed": int(s[1]) if s else 0, "accepted": int(s[2]) if s else 0}


results = []
with tempfile.TemporaryDirectory() as d:
    for i, task in enumerate(tasks):
        f = os.path.join(d, task["id"] + ".txt")
        open(f, "w").write(task["prompt"])
        order = modes if i % 2 == 0 else modes[::-1]  # alternate which mode runs first
        r = {m: run(m, f) for m in order}
        results.append({"id": task["id"], "kind": task["kind"], **r})
        line = [task["id"], task["kind"]]
        for m in modes:
            x = r[m]
            line.append(f"{m} {x['tps']:.2f}" + (f" ({x['tps'] / r['plain']['tps']:.2f}x, {x['accepted']}/{x['proposed']})" if m != "plain" and "plain" in r else ""))
        print(" | ".join(line), file=sys.stderr, flush=True)

if a.json:
    json.dump({"args": vars(a), "results": results}, open(a.json, "w"), indent=1)

spec_modes = [m for m in modes if m != "plain"]
print(f"| task | kind | plain tok/s | " + " | ".join(f"{m} tok/s (÷ plain) | {m} accepted / proposed | {m} text = plain" for m in spec_modes) + " |")
print("|---|---|---|" + "---|---|---|" * len(spec_modes))
for r in results:
    cells = [r["id"], r["kind"], f"{r['plain']['tps']:.2f}"]
    for m in spec_modes:
        x = r[m]
        acc = f"{x['accepted']} / {x['proposed']}" + (f" ({100 * x['accepted'] / x['proposed']:.0f}%)" if x["proposed"] else "")
        cells += [f"{x['tps']:.2f} ({x['tps'] / r['plain']['tps']:.2f}×)", acc, "yes" if x["text"] == r["plain"]["text"] else "**no**"]
    print("| " + " | ".join(cells) + " |")
print()
for kind in ["edit", "fresh"]:
    rs = [r for r in results if r["kind"] == kind]
    if not rs:
        continue
    for m in spec_modes:
        ratios = [r[m]["tps"] / r["plain"]["tps"] for r in rs]
        # Overall: every generated token over every decode second, as one long session would see it.
        tot = sum(r[m]["generated"] for r in rs) / sum(r[m]["ms"] for r in rs)
        tot_p = sum(r["plain"]["generated"] for r in rs) / sum(r["plain"]["ms"] for r in rs)
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        same = sum(r[m]["text"] == r["plain"]["text"] for r in rs)
        print(f"- {kind}, {m}: overall {tot / tot_p:.2f}× (geometric mean {geo:.2f}×, min {min(ratios):.2f}×, max {max(ratios):.2f}×); "
              f"accepted {sum(r[m]['accepted'] for r in rs)} of {sum(r[m]['proposed'] for r in rs)}; text equal to plain {same}/{len(rs)}")
