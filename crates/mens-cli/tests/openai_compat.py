"""Compatibility of `mens serve` with the official `openai` Python client.

Usage: python openai_compat.py BASE_URL API_KEY
Exits non-zero (with the failing assertion) when anything is off.
"""
import sys

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
print("openai client: all checks passed")
