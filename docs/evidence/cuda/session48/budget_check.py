"""The reasoning budget and llama-server's route names on a running `mens serve` (any backend):
stdlib only. Usage: budget_check.py URL. The server must run a template that opens `<think>`.
Prints one line per check and exits non-zero when one fails.
Session 48: every request is cold (its own `user`, so its own tenant: no cached prefix). Session 47's
version compared a warm request's text with a cold one's, which on CUDA is not the same arithmetic
(the prompt's last token as a decode row after the reused prefix, against one prefill pass): on the
synthetic 0.5B's flat logits the greedy texts parted after 5 tokens (H100, call 1)."""
import json
import sys
import urllib.request

URL = sys.argv[1]
fails = 0


N = 0


def post(path, body):
    global N
    N += 1
    body = {**body, "user": f"check-{N}"}
    r = urllib.request.Request(URL + path, data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())


def check(name, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "  " + detail))
    fails += 0 if ok else 1


def ask(extra):
    b = {"messages": [{"role": "user", "content": "Explain hash maps."}], "max_tokens": 40,
         "temperature": 0}
    b.update(extra)
    v = post("/v1/chat/completions", b)
    m = v["choices"][0]["message"]
    return (v["usage"]["completion_tokens_details"]["reasoning_tokens"],
            m.get("reasoning_content") or "", v)


tag = len(post("/tokenize", {"content": "</think>"})["tokens"])
for label, extra in [("greedy", {}), ("penalised", {"repeat_penalty": 1.1})]:
    free_n, free_r, v = ask(extra)
    print(f"{label}: unbounded block {free_n} tokens")
    if free_n <= 12:
        check(f"{label}: the unbounded block is longer than the budget", False, json.dumps(v))
        continue
    n, r, v = ask({**extra, "thinking_budget_tokens": 8})
    check(f"{label}: budget 8 gives 8 + {tag} tokens", n == 8 + tag, json.dumps(v))
    check(f"{label}: the budgeted block is the unbounded one's start",
          free_r.startswith(r) and len(r) < len(free_r), f"{r!r} / {free_r!r}")
    n, r, v = ask({**extra, "thinking_budget_tokens": 0})
    check(f"{label}: budget 0 closes at once", n == tag and r == "", json.dumps(v))

a = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 4, "temperature": 0})
c = post("/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4, "temperature": 0})
check("/chat/completions answers as /v1/chat/completions", a["choices"] == c["choices"])
n = post("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]})
check("input_tokens counts the prompt", n["input_tokens"] == a["usage"]["prompt_tokens"], json.dumps(n))
print("failures:", fails)
sys.exit(1 if fails else 0)
