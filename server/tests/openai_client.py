"""The official `openai` Python client against specdec-server: chat, streaming,
response_format with a JSON schema, a tool call, and an error. Usage:
    python3 openai_client.py BASE_URL MODEL
Exits non-zero (an assertion) on anything unexpected."""
import json
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)

# Chat.
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24, temperature=0)
text = r.choices[0].message.content
assert isinstance(text, str) and text, r
assert r.choices[0].finish_reason in ("stop", "length"), r
assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage
print("chat:", repr(text))

# Streaming: the same text, usage at the end.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
parts, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        finish = c.finish_reason or finish
assert "".join(parts) == text, ("".join(parts), text)
assert finish == r.choices[0].finish_reason and usage.completion_tokens == r.usage.completion_tokens
print("stream: same text in", len(parts), "chunks")

# response_format with a JSON schema.
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Give the largest city of Japan as JSON."}], max_tokens=60,
    temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
value = json.loads(r.choices[0].message.content)
assert set(value) == {"city", "population"} and isinstance(value["population"], int), value
print("json_schema:", value)

# A tool call.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                         "required": ["city"], "additionalProperties": False}}}]
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=60,
    temperature=0, tools=tools, tool_choice="required")
call = r.choices[0].message.tool_calls[0]
assert r.choices[0].finish_reason == "tool_calls", r
assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str), call
print("tool call:", call.function.name, call.function.arguments)

# An error: an unknown model is a 404 with OpenAI's body.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body
    print("error:", e.status_code, e.body["message"])
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    raise AssertionError("a negative temperature was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body
print("openai client: all checks passed")
