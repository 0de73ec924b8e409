"""Compatibility of `mens serve` with the official `ollama` Python client (Ollama's API).

Usage: python ollama_compat.py BASE_URL API_KEY [--any-model]
Exits non-zero (with the failing assertion) when anything is off. `--any-model`: the protocol only,
for random-weight files (`mens synth`, as on the GPU machine): what the real 0.5B writes is not
checked there.
"""
import json
import sys

import httpx
import jsonschema
import ollama

base, key = sys.argv[1], sys.argv[2]
REAL = "--any-model" not in sys.argv[3:]
client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
GREEDY = {"temperature": 0, "seed": 1}

# The model list, as an editor's model picker reads it; its name is what requests send.
models = client.list().models
assert len(models) == 1, models
model = models[0].model
assert model.endswith(":latest") and models[0].details.format == "gguf", models[0]
assert models[0].size > 1_000_000 and models[0].details.quantization_level == "Q4_K_M", models[0]
print("list:", model, models[0].details.parameter_size)

# What it can do, and the context a request gets (`num_ctx`).
info = client.show(model)
assert "completion" in info.capabilities, info.capabilities
assert "num_ctx 2048" in info.parameters, info.parameters
assert info.modelinfo["general.architecture"] == "qwen2", info.modelinfo
if REAL:
    assert {"tools", "insert"} <= set(info.capabilities), info.capabilities
    assert info.modelinfo["qwen2.context_length"] == 32768, info.modelinfo
    assert "<|im_start|>" in info.template
    # Continue's Ollama provider turns fill-in-the-middle on when the template names `.Suffix`.
    assert ".Suffix" in info.template
assert client.ps().models[0].model == model

# Fill in the middle (what Ollama-speaking editor plugins send): a function body between its
# signature and its return.
if "insert" in info.capabilities:
    r = client.generate(model=model, prompt="def fibonacci(n):\n", suffix="\n    return result\n",
                        options={**GREEDY, "num_predict": 64})
    assert r.done and r.eval_count > 0, r
    assert not REAL or ("result" in r.response and "<|" not in r.response), r.response
    print("fim:", repr(r.response[:80]))

# A prompt through the chat template, streamed: text pieces, then the counts.
chunks = list(client.generate(model=model, prompt="Write a Python function that returns the square of x.",
                              system="You are a terse coding assistant.", stream=True,
                              options={**GREEDY, "num_predict": 40}))
text = "".join(c.response for c in chunks)
last = chunks[-1]
assert last.done and not any(c.done for c in chunks[:-1]), chunks[-1]
assert last.eval_count <= 40 and last.prompt_eval_count > 10, (text, last)
assert not REAL or "def" in text, text
assert last.done_reason in ("stop", "length") and last.eval_duration > 0
whole = client.generate(model=model, prompt="Write a Python function that returns the square of x.",
                        system="You are a terse coding assistant.", options={**GREEDY, "num_predict": 40})
# (Random weights give nearly flat logits: a warm prompt's other pass split can change a pick.)
assert not REAL or whole.response == text, (whole.response, text)
print("generate:", repr(text[:60]), last.done_reason)

# Chat with a tool: the call comes back parsed, its arguments an object; then the result goes back.
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat(model=model, messages=msgs, tools=[weather], options={**GREEDY, "num_predict": 40})
if not REAL:
    # Random weights call no tool: the answer is what is checked.
    assert r.done and r.prompt_eval_count > 10, r
    r.message.tool_calls = [ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(
        name="get_weather", arguments={"city": "Paris"}))]
calls = r.message.tool_calls
assert calls and calls[0].function.name == "get_weather", r.message
assert isinstance(calls[0].function.arguments, dict) and "city" in calls[0].function.arguments, calls
print("tool call:", calls[0].function.name, dict(calls[0].function.arguments))
streamed = [c for c in client.chat(model=model, messages=msgs, tools=[weather], stream=True,
                                   options={**GREEDY, "num_predict": 40})]
scalls = [t for c in streamed for t in (c.message.tool_calls or [])]
assert not REAL or [(t.function.name, dict(t.function.arguments)) for t in scalls] == \
    [(t.function.name, dict(t.function.arguments)) for t in calls], scalls
if REAL:
    # Since Ollama 0.12.10 a call has an id (and an index), which a tool result may name.
    raw = httpx.post(base + "/api/chat", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                     json={"model": model, "messages": msgs, "tools": [weather], "stream": False,
                           "options": {**GREEDY, "num_predict": 40}}).json()
    rc = raw["message"]["tool_calls"][0]
    assert rc["id"].startswith("call_") and rc["function"]["index"] == 0, rc
msgs += [r.message, {"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"}]
r2 = client.chat(model=model, messages=msgs, tools=[weather], options={**GREEDY, "num_predict": 40})
# The call and its result went into the prompt (the 0.5B then answers or calls again: its choice).
assert r2.prompt_eval_count > r.prompt_eval_count + 15, (r2.prompt_eval_count, r.prompt_eval_count)
assert not REAL or r2.message.content or r2.message.tool_calls, r2.message
print("after the tool:", repr((r2.message.content or "")[:60]))

# Structured output: a JSON schema as `format`; the answer parses and validates.
schema = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}},
    "required": ["name", "age", "languages"], "additionalProperties": False}
r = client.chat(model=model, format=schema, options={**GREEDY, "num_predict": 400},
                messages=[{"role": "user", "content": "Describe a programmer named Ada, 36, as JSON."}])
v = json.loads(r.message.content)
jsonschema.validate(v, schema)
print("format:", v)

# Embeddings: /api/embed (unit vectors, one per input) and the older /api/embeddings (the vector
# as the model gives it).
try:
    e = client.embed(model=model, input=["def add(a, b): return a + b", "The weather is nice today."])
except ollama.ResponseError as x:
    # A GPU server (`--any-model` runs on the device) computes no embeddings: a clear 501.
    assert not REAL and x.status_code == 501, (x.status_code, x.error)
    e = None
if e is None:
    print("embed: not on this backend (501)")
else:
    assert len(e.embeddings) == 2 and all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in e.embeddings)
    assert e.prompt_eval_count > 8, e.prompt_eval_count
    old = client.embeddings(model=model, prompt="def add(a, b): return a + b")
    n = sum(x * x for x in old.embedding) ** 0.5
    assert len(old.embedding) == len(e.embeddings[0]) and n > 0
    assert max(abs(a / n - b) for a, b in zip(old.embedding, e.embeddings[0])) < 1e-4
    print("embed: %d vectors of %d" % (len(e.embeddings), len(e.embeddings[0])))

# Errors come back as the client's ResponseError with the status.
try:
    client.chat(model="no-such-model", messages=msgs[:1])
    raise AssertionError("an unknown model was accepted")
except ollama.ResponseError as e:
    assert e.status_code == 404 and "not found" in e.error, (e.status_code, e.error)
try:
    ollama.Client(host=base).list()
    raise AssertionError("a request without the key was accepted")
except ollama.ResponseError as e:
    assert e.status_code == 401, e.status_code

print("ollama client: all checks passed")
