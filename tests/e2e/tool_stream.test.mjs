// Streamed tool calls through the real server: a scripted model (tests/e2e/scripted_model.mjs) answers every
// request with one Hermes <tool_call>, so the arguments arrive over many tokens. Checks that the openai SDK's
// chat stream gets the call's id and name first, then argument pieces in more than one delta that join to
// exactly the non-stream arguments; the same for Anthropic input_json_delta and Responses function_call
// events.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, deadline, post, parseSSE } from './lib.mjs';
import { scriptedModel } from './scripted_model.mjs';

deadline(120000);
const ARGS = '{"city":"Paris"}';
const model = scriptedModel(`<tool_call>{"name": "get_weather", "arguments": ${ARGS}}</tool_call>`);
const server = await startServer([], { model });
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
test.after(async () => { await server.stop(); });

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('chat: the tool call streams its arguments piecewise and they join to the final arguments', async () => {
  const full = await client.chat.completions.create({ messages, tools, max_tokens: 80, temperature: 0 });
  const call = full.choices[0].message.tool_calls[0];
  assert.equal(full.choices[0].finish_reason, 'tool_calls');
  assert.equal(full.choices[0].message.content, null);
  assert.equal(call.function.name, 'get_weather');
  assert.equal(call.function.arguments, ARGS);
  assert.match(call.id, /^call_/);

  const stream = await client.chat.completions.create({ messages, tools, max_tokens: 80, temperature: 0, stream: true });
  const deltas = [];
  let finish = null, content = '';
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? '';
    for (const tc of c.delta?.tool_calls ?? []) deltas.push(tc);
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.ok(deltas.length >= 3, `expected a first delta and several argument pieces, got ${JSON.stringify(deltas)}`);
  const [first, ...rest] = deltas;
  assert.equal(first.index, 0);
  assert.match(first.id, /^call_/);
  assert.equal(first.type, 'function');
  assert.equal(first.function.name, 'get_weather');
  assert.equal(first.function.arguments, '');
  for (const d of rest) {
    assert.equal(d.index, 0);
    assert.equal(d.id, undefined);
    assert.equal(d.function.name, undefined);
  }
  const pieces = rest.map((d) => d.function.arguments);
  assert.ok(pieces.length > 1, `arguments came in one piece: ${JSON.stringify(pieces)}`);
  assert.ok(pieces[0].length < ARGS.length);
  assert.equal(pieces.join(''), ARGS);
  assert.deepEqual(JSON.parse(pieces.join('')), { city: 'Paris' });
});

test('anthropic: tool_use block with input_json_delta pieces', async () => {
  const req = { model: 'x', max_tokens: 80, temperature: 0, messages,
    tools: [{ name: 'get_weather', description: 'weather', input_schema: tools[0].function.parameters }] };
  const full = await post(`${server.baseURL}/messages`, req);
  assert.equal(full.status, 200, full.text);
  assert.equal(full.body.stop_reason, 'tool_use');
  assert.deepEqual(full.body.content.map((c) => c.type), ['tool_use']);
  assert.deepEqual(full.body.content[0].input, { city: 'Paris' });
  const s = await post(`${server.baseURL}/messages`, { ...req, stream: true });
  const ev = parseSSE(s.text);
  const start = ev.find((e) => e.event === 'content_block_start');
  assert.equal(start.data.content_block.type, 'tool_use');
  assert.equal(start.data.content_block.name, 'get_weather');
  assert.match(start.data.content_block.id, /^toolu_/);
  const pieces = ev.filter((e) => e.event === 'content_block_delta').map((e) => {
    assert.equal(e.data.delta.type, 'input_json_delta');
    return e.data.delta.partial_json;
  });
  assert.ok(pieces.length > 1);
  assert.equal(pieces.join(''), ARGS);
  assert.deepEqual(ev.map((e) => e.event).filter((e) => e !== 'content_block_delta'),
    ['message_start', 'content_block_start', 'content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(ev.find((e) => e.event === 'message_delta').data.delta.stop_reason, 'tool_use');
});

test('responses: function_call item, non-stream and streamed arguments', async () => {
  const rtools = [{ type: 'function', name: 'get_weather', description: 'weather', parameters: tools[0].function.parameters }];
  const r = await client.responses.create({ model: 'x', input: 'What is the weather in Paris?', tools: rtools, temperature: 0, max_output_tokens: 80 });
  assert.equal(r.status, 'completed');
  assert.equal(r.output.length, 1);
  const fc = r.output[0];
  assert.equal(fc.type, 'function_call');
  assert.equal(fc.name, 'get_weather');
  assert.equal(fc.arguments, ARGS);
  assert.match(fc.call_id, /^call_/);
  assert.equal(r.output_text, '');

  const stream = await client.responses.create({ model: 'x', input: 'What is the weather in Paris?', tools: rtools, temperature: 0,
    max_output_tokens: 80, stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  const types = events.map((e) => e.type).filter((t) => t !== 'response.function_call_arguments.delta');
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.function_call_arguments.done', 'response.output_item.done', 'response.completed']);
  const pieces = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta);
  assert.ok(pieces.length > 1);
  assert.equal(pieces.join(''), ARGS);
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(done.arguments, ARGS);
  assert.equal(done.name, 'get_weather');
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const completed = events.at(-1).response;
  assert.equal(completed.output[0].arguments, ARGS);
  assert.equal(completed.output[0].status, 'completed');
  // The call and its output go back in as input items.
  const next = await client.responses.create({ model: 'x', tools: rtools, max_output_tokens: 2, input: [
    { role: 'user', content: 'What is the weather in Paris?' },
    { type: 'function_call', call_id: fc.call_id, name: fc.name, arguments: fc.arguments },
    { type: 'function_call_output', call_id: fc.call_id, output: '{"temp_c": 21}' }] });
  assert.ok(next.usage.input_tokens > r.usage.input_tokens + 10);
});
