// response_format through the openai SDK: json_object and json_schema on the default model
// (models/arbor-tiny-sotu) at temperature 0 and 0.8 with a seed, streamed and not, n > 1; the Responses
// API's text.format; a 151k-token tokenizer (the Qwen3 fixture); and 400s naming the malformed field.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, deadline, post } from './lib.mjs';

deadline(240000);
const server = await startServer([], { model: null });  // the default model
const qwen = await startServer();                        // synthetic weights, Qwen3's real tokenizer
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
const qclient = new OpenAI({ baseURL: qwen.baseURL, apiKey: 'unused' });
test.after(async () => { await server.stop(); await qwen.stop(); });

const messages = [{ role: 'user', content: 'Describe the state of the union as JSON.' }];
// The default model writes speeches: inside a string it would go on for ever. A bias towards its '"'
// tokens ('"' 6, ' "' 1001) and '}' (97) lets values and objects close within the token budget; the
// constraint alone decides what is allowed.
const closeBias = { 6: 10, 1001: 10, 97: 10 };
const person = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    age: { type: 'integer' },
    member: { type: 'boolean' },
    party: { enum: ['blue', 'red', 7] },
    address: { type: 'object', properties: { zip: { type: 'integer' } }, required: ['zip'], additionalProperties: false },
  },
  required: ['name', 'age', 'member', 'party', 'address'],
  additionalProperties: false,
};
const schemaFormat = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } };

function checkPerson(v) {
  assert.deepEqual(Object.keys(v).sort(), ['address', 'age', 'member', 'name', 'party']);
  assert.equal(typeof v.name, 'string');
  assert.ok(Number.isInteger(v.age), String(v.age));
  assert.equal(typeof v.member, 'boolean');
  assert.ok(['blue', 'red', 7].includes(v.party), String(v.party));
  assert.deepEqual(Object.keys(v.address), ['zip']);
  assert.ok(Number.isInteger(v.address.zip));
}

for (const [label, sampling] of [['temperature 0', { temperature: 0 }], ['temperature 0.8, seed', { temperature: 0.8, seed: 11 }]]) {
  test(`json_object, ${label}: the content parses as an object and ends with it`, async () => {
    const r = await client.chat.completions.create({ messages, ...sampling, max_tokens: 300, logit_bias: closeBias,
      response_format: { type: 'json_object' } });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
    assert.ok(c.message.content.trimEnd().endsWith('}'));
  });

  test(`json_schema, ${label}: required keys with the schema's types`, async () => {
    const r = await client.chat.completions.create({ messages, ...sampling, max_tokens: 400, logit_bias: { 6: 3, 1001: 3 },
      response_format: schemaFormat });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    checkPerson(JSON.parse(c.message.content));
  });
}

test('without response_format the same request is prose', async () => {
  const r = await client.chat.completions.create({ messages, temperature: 0, max_tokens: 20 });
  assert.throws(() => JSON.parse(r.choices[0].message.content));
});

test('streamed json_schema: the deltas join into the same JSON', async () => {
  const req = { messages, temperature: 0.8, seed: 5, max_tokens: 400, logit_bias: { 6: 3, 1001: 3 }, response_format: schemaFormat };
  const whole = (await client.chat.completions.create(req)).choices[0].message.content;
  const s = await client.chat.completions.create({ ...req, stream: true });
  let text = '', finish = null;
  for await (const ch of s) { text += ch.choices[0]?.delta?.content ?? ''; finish = ch.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, whole);
  assert.equal(finish, 'stop');
  checkPerson(JSON.parse(text));
});

test('n = 3: every choice is its own valid JSON', async () => {
  const r = await client.chat.completions.create({ messages, temperature: 1.0, seed: 2, n: 3, max_tokens: 400,
    logit_bias: { 6: 3, 1001: 3 }, response_format: schemaFormat });
  assert.equal(r.choices.length, 3);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'stop', c.message.content);
    checkPerson(JSON.parse(c.message.content));
  }
  assert.ok(new Set(r.choices.map((c) => c.message.content)).size > 1);
});

test('Responses API: text.format json_schema', async () => {
  const r = await client.responses.create({ input: 'Describe the state of the union as JSON.', temperature: 0, max_output_tokens: 400,
    logit_bias: { 6: 3, 1001: 3 },
    text: { format: { type: 'json_schema', name: 'person', strict: true, schema: person } } });
  assert.equal(r.status, 'completed');
  assert.equal(r.text.format.type, 'json_schema');
  checkPerson(JSON.parse(r.output_text));
});

test('a 151k-token tokenizer (Qwen3): json_schema and json_object', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, kind: { enum: ['a', 'b'] }, none: { type: 'null' } },
    required: ['ok', 'kind', 'none'], additionalProperties: false };
  for (const seed of [1, 2, 3]) {
    const r = await qclient.chat.completions.create({ messages, temperature: 0.8, seed, max_tokens: 300,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v.ok, 'boolean');
    assert.ok(['a', 'b'].includes(v.kind));
    assert.equal(v.none, null);
  }
  // Random weights rarely close a free object; whatever stops is valid, whatever runs out is a valid prefix.
  const r = await qclient.chat.completions.create({ messages, temperature: 0, max_tokens: 40, response_format: { type: 'json_object' } });
  const c = r.choices[0];
  if (c.finish_reason === 'stop') JSON.parse(c.message.content);
  else assert.match(c.message.content, /^\s*\{/);
});

test('malformed response_format is a 400 naming the field', async () => {
  const chat = `${server.baseURL}/chat/completions`;
  const cases = [
    [{ type: 'xml' }, 'response_format.type', /'text', 'json_object' or 'json_schema'/],
    ['json', 'response_format', /must be an object/],
    [{}, 'response_format.type', /is required/],
    [{ type: 'json_schema' }, 'response_format.json_schema', /is required/],
    [{ type: 'json_schema', json_schema: { name: 'x' } }, 'response_format.json_schema.schema', /is required/],
    [{ type: 'json_schema', json_schema: { name: 'x', schema: [1] } }, 'response_format.json_schema.schema', /JSON Schema object/],
    [{ type: 'json_schema', json_schema: { name: 'x', schema: { type: 'strng' } } }, 'response_format.json_schema.schema.type', /must name/],
    [{ type: 'json_schema', json_schema: { name: 'x', schema: { properties: { a: { type: 'integer' } }, required: ['b'] } } },
      'response_format.json_schema.schema.required', /'b'/],
    [{ type: 'json_schema', json_schema: { name: 'x', schema: { properties: { a: { items: 3 } } } } },
      'response_format.json_schema.schema.properties.a.items', /schema object/],
  ];
  for (const [rf, param, re] of cases) {
    const r = await post(chat, { messages, response_format: rf });
    assert.equal(r.status, 400, r.text);
    const err = JSON.parse(r.text).error;
    assert.equal(err.param, param, r.text);
    assert.match(err.message, re);
  }
  const r = await post(`${server.baseURL}/responses`, { input: 'x', text: { format: { type: 'json_schema', name: 'x', schema: 'no' } } });
  assert.equal(r.status, 400, r.text);
  assert.equal(JSON.parse(r.text).error.param, 'text.format.schema');
});
