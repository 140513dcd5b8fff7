// OpenAI Responses API (/v1/responses) through the official SDK: the response object, input as a string and
// as message items with instructions, the stream's event order and numbering (final text = the deltas
// joined = the non-stream text), max_output_tokens → incomplete, and errors naming the field.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, deadline, post } from './lib.mjs';

deadline(120000);
const server = await startServer();
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
test.after(async () => { await server.stop(); });

const base = { model: 'anything', temperature: 0, max_output_tokens: 8 };

test('non-stream: response object, string input and message items with instructions', async () => {
  const r = await client.responses.create({ ...base, input: 'Hello there' });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, 'qwen3-tiny');
  assert.equal(r.status, 'incomplete');  // the random model runs to max_output_tokens
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.content[0].type, 'output_text');
  assert.deepEqual(m.content[0].annotations, []);
  assert.ok(m.content[0].text.length > 0);
  assert.equal(r.output_text, m.content[0].text);  // the SDK's convenience field
  assert.equal(r.usage.output_tokens, 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.usage.input_tokens_details.cached_tokens, 0);

  // The same conversation as items, with instructions as the system turn, renders the same as chat does.
  const items = await client.responses.create({ ...base, instructions: 'Be brief.',
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hello ' }, { type: 'input_text', text: 'there' }] }] });
  const chat = await client.chat.completions.create({ model: 'x', temperature: 0, max_tokens: 8,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
  assert.equal(items.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(items.output_text, chat.choices[0].message.content);
  assert.equal(items.instructions, 'Be brief.');
});

test('stream: text events in order; final text equals the joined deltas and the non-stream text', async () => {
  const full = await client.responses.create({ ...base, input: 'Tell me about the union' });
  const stream = await client.responses.create({ ...base, input: 'Tell me about the union', stream: true });
  const events = [];
  for await (const e of stream) events.push(e);
  const types = events.map((e) => e.type);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length > 1);
  assert.deepEqual(types.filter((t) => t !== 'response.output_text.delta'), ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added', 'response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  assert.ok(types.indexOf('response.output_text.delta') > types.indexOf('response.content_part.added'));
  assert.ok(types.lastIndexOf('response.output_text.delta') < types.indexOf('response.output_text.done'));
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const text = deltas.map((d) => d.delta).join('');
  const itemId = events[2].item.id;
  for (const d of deltas) {
    assert.equal(d.item_id, itemId);
    assert.equal(d.output_index, 0);
    assert.equal(d.content_index, 0);
  }
  assert.equal(events.find((e) => e.type === 'response.output_text.done').text, text);
  const last = events.at(-1).response;
  assert.equal(last.status, 'incomplete');
  assert.equal(last.output[0].content[0].text, text);
  assert.equal(last.usage.output_tokens, 8);
  assert.equal(text, full.output_text);
  assert.equal(events[0].response.status, 'in_progress');
  assert.equal(events[0].response.id, last.id);
});

test('errors name the field', async () => {
  for (const [body, param] of [[{ max_output_tokens: 4 }, 'input'], [{ input: 5 }, 'input'],
    [{ input: [{ role: 'robot', content: 'x' }] }, 'input[0].role'], [{ input: [{ type: 'web_search_call' }] }, 'input[0].type'],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0].type'], [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content[0]']]) {
    const r = await post(`${server.baseURL}/responses`, body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.body.error.param, param, r.text);
  }
});
