// The official `openai` JS client against `fathom serve` (base URL in
// argv[2]): a required tool call, a streamed one, and a json_schema
// response_format. Exits non-zero with the reason on any failure.
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Current weather of a city", strict: true,
    parameters: {
      type: "object", additionalProperties: false, required: ["city"],
      properties: { city: { type: "string", maxLength: 40 } },
    },
  },
}];
const messages = [{ role: "user", content: "What is the weather in Oslo?" }];

const r = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 100 });
assert.equal(r.choices[0].finish_reason, "tool_calls");
const call = r.choices[0].message.tool_calls[0];
assert.equal(call.function.name, "get_weather");
assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
console.log("required: ok");

const stream = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 100, stream: true });
let args = "", name = "", finish = null;
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  finish = c.finish_reason ?? finish;
  for (const d of c.delta.tool_calls ?? []) {
    name += d.function?.name ?? "";
    args += d.function?.arguments ?? "";
  }
}
assert.equal(finish, "tool_calls");
assert.equal(name, "get_weather");
assert.equal(typeof JSON.parse(args).city, "string");
console.log("streamed: ok");

const schema = { type: "object", additionalProperties: false, required: ["answer"], properties: { answer: { type: "boolean" } } };
const s = await client.chat.completions.create({
  model, max_tokens: 30, messages: [{ role: "user", content: "Is Oslo in Norway?" }],
  response_format: { type: "json_schema", json_schema: { name: "yes_no", strict: true, schema } },
});
assert.equal(typeof JSON.parse(s.choices[0].message.content).answer, "boolean");
console.log("json_schema: ok");
