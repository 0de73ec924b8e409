"""Compatibility of `mens serve` with the official `anthropic` Python client (Messages API).

Usage: python anthropic_compat.py BASE_URL API_KEY
Exits non-zero (with the failing assertion) when anything is off.
"""
import sys

import anthropic

base, key = sys.argv[1], sys.argv[2]
# This client release has no sampling arguments: they go in the body as the API defines them.
GREEDY = {"temperature": 0}
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
model = "mens"  # any name the server serves; checked below against the served one
models = __import__("json").loads(__import__("urllib.request").request.urlopen(
    __import__("urllib.request").request.Request(base + "/v1/models", headers={"x-api-key": key})).read())
model = models["data"][0]["id"]

# A message, greedy.
m = client.messages.create(
    model=model, max_tokens=40, extra_body=GREEDY,
    system="You are a terse coding assistant.",
    messages=[{"role": "user", "content": "Write a Python function that returns the square of x."}],
)
assert m.type == "message" and m.role == "assistant", m
assert m.content[0].type == "text" and "def" in m.content[0].text, m.content
assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
print("message:", repr(m.content[0].text[:60]), m.stop_reason)

# Streaming: the same text, assembled by the client's stream helper.
with client.messages.stream(
    model=model, max_tokens=40, extra_body=GREEDY,
    system="You are a terse coding assistant.",
    messages=[{"role": "user", "content": "Write a Python function that returns the square of x."}],
) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
assert text == m.content[0].text, (text, m.content[0].text)
assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
print("stream: same text,", final.usage.output_tokens, "tokens")

# Stop sequences.
m2 = client.messages.create(
    model=model, max_tokens=40, extra_body=GREEDY, stop_sequences=["x"],
    messages=[{"role": "user", "content": "Write a Python function that returns the square of x."}],
)
if m2.stop_reason == "stop_sequence":
    assert m2.stop_sequence == "x" and "x" not in m2.content[0].text
print("stop_sequences:", m2.stop_reason)

# Tool use: forced with tool_choice any, then the result goes back as a tool_result block.
tools = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
t = client.messages.create(
    model=model, max_tokens=60, extra_body=GREEDY, tools=tools, tool_choice={"type": "any"},
    messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
)
uses = [b for b in t.content if b.type == "tool_use"]
assert t.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", t
assert isinstance(uses[0].input, dict) and "city" in uses[0].input, uses[0].input
with client.messages.stream(
    model=model, max_tokens=60, extra_body=GREEDY, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
    messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
) as s:
    streamed = s.get_final_message()
su = [b for b in streamed.content if b.type == "tool_use"]
assert streamed.stop_reason == "tool_use" and su[0].input == uses[0].input, streamed
r = client.messages.create(
    model=model, max_tokens=40, extra_body=GREEDY, tools=tools,
    messages=[{"role": "user", "content": "What is the weather in Oslo?"},
              {"role": "assistant", "content": t.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "-3 C, snow"}]}],
)
assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
print("tool use:", uses[0].input, "then", r.stop_reason)

# count_tokens.
c = client.messages.count_tokens(
    model=model, system="You are a terse coding assistant.",
    messages=[{"role": "user", "content": "Write a Python function that returns the square of x."}],
)
# The prompt is the uncached input plus what the cache held.
prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens
assert c.input_tokens == prompt, (c.input_tokens, m.usage)
print("count_tokens:", c.input_tokens)

# Errors in Anthropic's shape, as the client's exception types.
try:
    client.messages.create(model=model, max_tokens=10, extra_body={"temperature": -1}, messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("negative temperature was accepted")
except anthropic.BadRequestError as e:
    assert e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", e.body
bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
try:
    bad.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    assert e.status_code == 401
print("anthropic client: all checks passed")
