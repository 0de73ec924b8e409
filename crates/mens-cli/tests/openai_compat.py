"""Compatibility of `mens serve` with the official `openai` Python client.

Usage: python openai_compat.py BASE_URL API_KEY
Exits non-zero (with the failing assertion) when anything is off.
"""
import json
import sys

import jsonschema
import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)

models = client.models.list()
ids = [m.id for m in models.data]
assert len(ids) == 1, ids
model = ids[0]

# Chat completion.
r = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Write a Python function that returns the square of x."},
    ],
    max_tokens=48,
    temperature=0,
)
text = r.choices[0].message.content
assert r.object == "chat.completion"
assert r.choices[0].message.role == "assistant"
assert "def" in text, text
assert r.choices[0].finish_reason in ("stop", "length")
assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
print("chat:", repr(text[:60]))

# Streaming chat, with usage; greedy, so the same text as above.
stream = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Write a Python function that returns the square of x."},
    ],
    max_tokens=48,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
streamed = "".join(pieces)
assert streamed == text, (streamed, text)
assert finish == r.choices[0].finish_reason
assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
print("stream: %d chunks" % len(pieces))

# Text completion, plain and streamed.
c = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=16, temperature=0)
assert c.object == "text_completion" and len(c.choices[0].text) > 0
s = "".join(
    ch.choices[0].text
    for ch in client.completions.create(
        model=model, prompt="def fibonacci(n):", max_tokens=16, temperature=0, stream=True
    )
    if ch.choices
)
assert s == c.choices[0].text, (s, c.choices[0].text)
print("completion:", repr(c.choices[0].text))

# Invalid requests raise the client's error types.
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], temperature=-1
    )
    raise AssertionError("negative temperature was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
    assert "temperature" in str(e)
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    raise AssertionError("empty messages were accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=10**7
    )
    raise AssertionError("max_tokens beyond the context was accepted")
except openai.BadRequestError as e:
    assert "context" in str(e)
bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

# Structured output: a strict JSON schema, sampled; the answer validates.
schema = {
    "type": "object",
    "properties": {
        "function": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
        "args": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "pure": {"type": "boolean"},
    },
    "required": ["function", "args", "pure"],
    "additionalProperties": False,
}
for seed in range(3):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a Python function that adds two numbers."}],
        response_format={"type": "json_schema", "json_schema": {"name": "fn", "strict": True, "schema": schema}},
        max_tokens=100, temperature=0.7, seed=seed,
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
print("json_schema: 3 sampled answers validate")

# Tools, streamed: the client assembles tool_calls deltas.
tools = [{"type": "function", "function": {
    "name": "run_tests", "description": "Run the test suite of a path",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
stream = client.chat.completions.create(
    model=model, tools=tools, tool_choice="required", temperature=0, max_tokens=60, stream=True,
    messages=[{"role": "user", "content": "Run the tests in src/."}],
)
calls, finish = {}, None
for chunk in stream:
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            e = calls.setdefault(d.index, {"name": "", "arguments": ""})
            e["name"] += d.function.name or ""
            e["arguments"] += d.function.arguments or ""
        finish = c.finish_reason or finish
assert finish == "tool_calls", finish
assert calls[0]["name"] == "run_tests", calls
assert "path" in json.loads(calls[0]["arguments"]), calls
r = client.chat.completions.create(
    model=model, tools=tools, tool_choice="required", temperature=0, max_tokens=60,
    messages=[{"role": "user", "content": "Run the tests in src/."}],
)
tc = r.choices[0].message.tool_calls[0]
assert tc.function.name == "run_tests" and json.loads(tc.function.arguments) == json.loads(calls[0]["arguments"])
# The result goes back as a tool message.
r = client.chat.completions.create(
    model=model, tools=tools, temperature=0, max_tokens=30,
    messages=[{"role": "user", "content": "Run the tests in src/."},
              r.choices[0].message,
              {"role": "tool", "tool_call_id": tc.id, "content": "3 passed, 1 failed: test_div"}],
)
assert r.choices[0].message.content or r.choices[0].message.tool_calls
# parallel_tool_calls as the client sends it: one call (false) or up to 8 (true).
for parallel in (False, True):
    r = client.chat.completions.create(
        model=model, tools=tools, tool_choice="required", temperature=0, max_tokens=120,
        parallel_tool_calls=parallel, messages=[{"role": "user", "content": "Run the tests in src/."}],
    )
    n = len(r.choices[0].message.tool_calls)
    assert (n == 1) if not parallel else (1 <= n <= 8), (parallel, n)
print("tools: streamed call", calls[0])

# logit_bias as the client sends it (token ids as keys): the greedy answer's first token banned.
plain = client.completions.create(model=model, prompt="def square(x):", max_tokens=4, temperature=0, logprobs=1)
first = plain.choices[0].logprobs.tokens[0]
import urllib.request
req = urllib.request.Request(base + "/tokenize", data=json.dumps({"content": first}).encode(),
                             headers={"content-type": "application/json", "authorization": "Bearer " + key})
tid = json.load(urllib.request.urlopen(req))["tokens"][0]
banned = client.completions.create(model=model, prompt="def square(x):", max_tokens=4, temperature=0, logprobs=1,
                                   logit_bias={str(tid): -100})
assert banned.choices[0].logprobs.tokens[0] != first, (first, banned.choices[0].text)
print("logit_bias: the first token", repr(first), "banned ->", repr(banned.choices[0].logprobs.tokens[0]))

# Log-probabilities.
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say OK."}], max_tokens=5, temperature=0,
    logprobs=True, top_logprobs=2,
)
lp = r.choices[0].logprobs.content
# One entry per token of text (the end-of-turn token that stops it is counted in usage, not shown).
assert len(lp) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop"), (len(lp), r.usage)
assert all(t.logprob <= 0 for t in lp)
assert all(t.top_logprobs[0].token == t.token for t in lp)
print("logprobs:", [(t.token, round(t.logprob, 3)) for t in lp])

# Fill in the middle with `suffix`.
c = client.completions.create(
    model=model, prompt="def add(a, b):\n", suffix="\n    return result\n", max_tokens=24, temperature=0,
)
assert len(c.choices[0].text) > 0
print("suffix:", repr(c.choices[0].text))

# The Responses API (stateless): text, streamed text, a forced function call and its output, a schema.
r = client.responses.create(model=model, instructions="You are terse.", max_output_tokens=40, temperature=0,
                            input="Write a Python function that returns the square of x.")
assert r.status in ("completed", "incomplete") and "def" in r.output_text, r
assert r.usage.output_tokens >= 1 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
text = ""
with client.responses.stream(model=model, instructions="You are terse.", max_output_tokens=40, temperature=0,
                             input="Write a Python function that returns the square of x.") as s:
    for ev in s:
        if ev.type == "response.output_text.delta":
            text += ev.delta
    final = s.get_final_response()
assert text == r.output_text and final.status == r.status, (text, r.output_text)
rtools = [{"type": "function", "name": "run_tests", "description": "Run the test suite of a path",
           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
r = client.responses.create(model=model, input="Run the tests in src/.", tools=rtools, tool_choice="required",
                            temperature=0, max_output_tokens=60)
fc = [o for o in r.output if o.type == "function_call"]
assert fc and fc[0].name == "run_tests" and "path" in json.loads(fc[0].arguments), r.output
r = client.responses.create(model=model, tools=rtools, temperature=0, max_output_tokens=30, input=[
    {"role": "user", "content": "Run the tests in src/."},
    {"type": "function_call", "call_id": fc[0].call_id, "name": fc[0].name, "arguments": fc[0].arguments},
    {"type": "function_call_output", "call_id": fc[0].call_id, "output": "2 passed"}])
assert r.status in ("completed", "incomplete"), r
# Sampled (no seed): every string bounded, so that the grammar ends the object within max_output_tokens
# (an unbounded name once ran past 60 tokens and was cut, 2026-12-02).
bounded = json.loads(json.dumps(schema))
bounded["properties"]["function"]["pattern"] = "^[a-z_][a-z0-9_]{0,23}$"
bounded["properties"]["args"]["items"]["maxLength"] = 16
r = client.responses.create(model=model, input="Give a JSON status.", temperature=0.7, max_output_tokens=200,
                            text={"format": {"type": "json_schema", "name": "st", "strict": True, "schema": bounded}})
assert r.status == "completed", (r.status, r.output_text)
jsonschema.validate(json.loads(r.output_text), bounded)
# Codex's kinds of tools: a namespace's function comes back under its namespace, a custom tool's
# call as a custom_tool_call with text input, a hosted web search is not offered.
ctools = [{"type": "namespace", "name": "tests", "description": "Test tools.", "tools": rtools},
          {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files."},
          {"type": "web_search"}]
r = client.responses.create(model=model, input="Run the tests in src/.", tools=ctools, temperature=0,
                            tool_choice={"type": "function", "namespace": "tests", "name": "run_tests"},
                            max_output_tokens=60)
fc = [o for o in r.output if o.type == "function_call"]
assert fc and fc[0].namespace == "tests" and fc[0].name == "run_tests", r.output
r = client.responses.create(model=model, input="Add the line x = 1 to a.py.", tools=ctools, temperature=0,
                            tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=60)
cc = [o for o in r.output if o.type == "custom_tool_call"]
assert cc and cc[0].name == "apply_patch" and isinstance(cc[0].input, str), r.output
print("responses: text, stream, function call, json_schema, namespace and custom tools")

# Embeddings: the client asks for base64 by default and decodes it; floats on request give the
# same vectors. Unit length (Euclidean), the model's width, texts apart from each other.
texts = ["def add(a, b):\n    return a + b\n", "The weather is nice today.", "def add(x, y): return x + y"]
e = client.embeddings.create(model=model, input=texts)
vecs = [d.embedding for d in sorted(e.data, key=lambda d: d.index)]
assert len(vecs) == 3 and len(set(map(len, vecs))) == 1 and len(vecs[0]) >= 64, [len(v) for v in vecs]
assert all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vecs)
assert e.usage.prompt_tokens == e.usage.total_tokens > 10, e.usage
f = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
assert max(abs(a - b) for a, b in zip(f.data[0].embedding, vecs[0])) < 1e-6
cos = lambda a, b: sum(x * y for x, y in zip(a, b))
assert cos(vecs[0], vecs[2]) > cos(vecs[0], vecs[1]), (cos(vecs[0], vecs[2]), cos(vecs[0], vecs[1]))
short = client.embeddings.create(model=model, input=texts[0], dimensions=32).data[0].embedding
assert len(short) == 32 and abs(sum(x * x for x in short) - 1) < 1e-3
print("embeddings: %d vectors of %d, code pair %.3f, code/prose %.3f" % (len(vecs), len(vecs[0]), cos(vecs[0], vecs[2]), cos(vecs[0], vecs[1])))

# llama-server's /tokenize and /detokenize; special-token text is text unless asked.
import urllib.request
from prometheus_client.parser import text_string_to_metric_families


def raw(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode(), {k.lower(): v for k, v in r.headers.items()}


text = "def f(x): return x<|im_end|>"
ids = json.loads(raw("/tokenize", {"content": text})[0])["tokens"]
assert json.loads(raw("/detokenize", {"tokens": ids})[0])["content"] == text
special = json.loads(raw("/tokenize", {"content": text, "parse_special": True})[0])["tokens"]
assert len(special) < len(ids), (special, ids)
pieces = json.loads(raw("/tokenize", {"content": "hello world", "with_pieces": True})[0])["tokens"]
assert "".join(p["piece"] for p in pieces) == "hello world"
print("tokenize:", len(ids), "tokens as text,", len(special), "with specials parsed")

# /metrics parses as Prometheus text and counts what this script did.
body, headers = raw("/metrics")
assert headers["content-type"].startswith("text/plain"), headers
fam = {f.name: f for f in text_string_to_metric_families(body)}
for name in ["mens_requests", "mens_prompt_tokens", "mens_generated_tokens", "mens_time_to_first_token_seconds",
             "mens_time_per_output_token_seconds", "mens_slots_busy", "mens_queue_length", "mens_kv_cache_tokens",
             "mens_cache_reused_tokens", "mens_kv_pages_used", "mens_kv_pages", "mens_preempted"]:
    assert name in fam, (name, sorted(fam))
# The CPU server has no paged pool: both page gauges read 0.
assert fam["mens_kv_pages"].samples[0].value == 0, fam["mens_kv_pages"].samples
chat_ok = sum(s.value for s in fam["mens_requests"].samples
              if s.labels.get("route") == "/v1/chat/completions" and s.labels.get("status") == "200")
assert chat_ok >= 8, chat_ok
gen = [s.value for s in fam["mens_generated_tokens"].samples if s.name == "mens_generated_tokens_total"][0]
assert gen > 100, gen
ttft = [s.value for s in fam["mens_time_to_first_token_seconds"].samples if s.name.endswith("_count")][0]
assert ttft >= 8, ttft
print("metrics: %d families, %d chat requests, %d tokens generated" % (len(fam), chat_ok, gen))
print("openai client: all checks passed")
