"""The official `openai` Python client against `fathom serve` (base URL in
argv[1]): function calling (required, named, streamed, a round trip with the
tool's result) and `chat.completions.parse` with a pydantic model. Exits
non-zero with the reason on any failure; prints one line per check."""

import json
import sys
from typing import List, Literal

import jsonschema
import openai
from pydantic import BaseModel, Field

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                       "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                       "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                                                      "required": ["zone"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def check_call(call):
    assert call.type == "function", call
    assert call.id.startswith("call_"), call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


# tools= with tool_choice="required", at several temperatures.
for seed, temperature in [(1, 0.0), (2, 0.9), (3, 1.5)]:
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=temperature, seed=seed, max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls, choice
    for call in choice.message.tool_calls:
        check_call(call)
print("required: ok")

# A named function.
r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
call = r.choices[0].message.tool_calls[0]
assert call.function.name == "get_time", call
check_call(call)
print("named: ok")

# Round trip: the call and its result go back, the model answers.
first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120)
call = first.choices[0].message.tool_calls[0]
history = ASK + [
    first.choices[0].message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
]
second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=120, temperature=0)
m = second.choices[0].message
assert m.content is not None or m.tool_calls, second
print("round trip: ok:", (m.content or "")[:60].replace("\n", " "))

# Streamed calls reassemble with the client's own types.
stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                        max_tokens=120, stream=True)
calls = {}
finish = None
for chunk in stream:
    if not chunk.choices:
        continue
    c = chunk.choices[0]
    finish = c.finish_reason or finish
    for d in c.delta.tool_calls or []:
        entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        if d.id:
            entry["id"] = d.id
        if d.function and d.function.name:
            entry["name"] = d.function.name
        if d.function and d.function.arguments:
            entry["arguments"] += d.function.arguments
assert finish == "tool_calls", finish
assert calls and all(e["id"] for e in calls.values()), calls
for e in calls.values():
    jsonschema.validate(json.loads(e["arguments"]), SCHEMAS[e["name"]])
print("streamed: ok")


# Structured output with a pydantic model.
class Ingredient(BaseModel):
    name: str = Field(max_length=30)
    grams: int = Field(ge=0, le=5000)


class Recipe(BaseModel):
    title: str = Field(max_length=60)
    difficulty: Literal["easy", "medium", "hard"]
    ingredients: List[Ingredient] = Field(max_length=4)
    vegetarian: bool


for seed in range(3):
    r = client.chat.completions.parse(model=MODEL, response_format=Recipe, seed=seed, temperature=0.8, max_tokens=300,
                                      messages=[{"role": "user", "content": "Give me a recipe for pancakes."}])
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Recipe), r
print("parse: ok:", parsed.model_dump_json()[:80])

# pydantic_function_tool: a strict tool from a model.
class Lookup(BaseModel):
    """Look a word up in the dictionary."""
    word: str = Field(max_length=30)


r = client.chat.completions.parse(model=MODEL, tools=[openai.pydantic_function_tool(Lookup)], tool_choice="required",
                                  max_tokens=100, messages=[{"role": "user", "content": "What does 'serendipity' mean?"}])
call = r.choices[0].message.tool_calls[0]
assert isinstance(call.function.parsed_arguments, Lookup), call
print("pydantic tool: ok")
