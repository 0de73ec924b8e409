"""A reasoning model's reasoning through the official `anthropic` and `openai` Python clients: a
`thinking` block (Messages API) and a `reasoning` item (Responses API), whole and streamed, sent
back on the next turn.

Usage: python thinking_compat.py BASE_URL API_KEY
The server runs a template that opens `<think>` in the assistant's turn (as thinking models'
templates do), so the model reasons, closes the block and answers.
"""
import json
import sys
import urllib.request

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
models = json.loads(urllib.request.urlopen(
    urllib.request.Request(base + "/v1/models", headers={"x-api-key": key})).read())
model = models["data"][0]["id"]
question = "What is the weather in Oslo, in celsius? Think briefly, then call the tool."
schema = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
          "required": ["city", "unit"]}

# Anthropic: a thinking block before the forced call.
ac = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
tools = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": schema}]
ask = dict(model=model, max_tokens=120, extra_body={"temperature": 0}, tools=tools,
           tool_choice={"type": "any"}, thinking={"type": "adaptive"},
           messages=[{"role": "user", "content": question}])
m = ac.messages.create(**ask)
assert isinstance(m.content[0], anthropic.types.ThinkingBlock), m.content
thought = m.content[0].thinking
assert thought.strip() and "</think>" not in thought, thought
uses = [b for b in m.content if b.type == "tool_use"]
assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", m
with ac.messages.stream(**ask) as s:
    deltas = "".join(e.delta.thinking for e in s
                     if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    final = s.get_final_message()
assert deltas == thought, (deltas, thought)
assert final.content[0].type == "thinking" and final.content[0].thinking == thought, final.content
# The whole turn, thinking block included, goes back with the tool's result.
r = ac.messages.create(
    model=model, max_tokens=40, extra_body={"temperature": 0}, tools=tools, thinking={"type": "adaptive"},
    messages=[{"role": "user", "content": question},
              {"role": "assistant", "content": m.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "-3 C, snow"}]}])
assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
print("anthropic: thinking", repr(thought[:50]), "then", uses[0].input, "; sent back:", r.stop_reason)

# Responses: a reasoning item before the forced call.
oc = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
rtools = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": schema}]
rask = dict(model=model, input=question, tools=rtools, tool_choice="required", temperature=0,
            max_output_tokens=120, reasoning={"effort": "medium"})
o = oc.responses.create(**rask)
assert o.output[0].type == "reasoning", o.output
rtext = o.output[0].content[0].text
assert rtext == thought, (rtext, thought)
calls = [i for i in o.output if i.type == "function_call"]
assert calls and calls[0].name == "get_weather", o.output
with oc.responses.stream(**rask) as s:
    deltas = "".join(e.delta for e in s if e.type == "response.reasoning_text.delta")
    final = s.get_final_response()
assert deltas == thought and final.output[0].type == "reasoning", (deltas, final.output)
r = oc.responses.create(model=model, tools=rtools, temperature=0, max_output_tokens=40, input=[
    {"role": "user", "content": question}, *[i.model_dump(exclude_none=True) for i in o.output],
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "-3 C, snow"}])
assert r.status in ("completed", "incomplete"), r
print("responses: reasoning item, then", calls[0].arguments, "; sent back:", r.status)
print("thinking clients: all checks passed")
