// The prefix cache through the server on the default model: a repeated chat request reports
// usage.prompt_tokens_details.cached_tokens > 0 (openai SDK, stream and not) and Anthropic's
// cache_read_input_tokens (anthropic SDK), the answer is the same as without the cache (--no-prefix-cache),
// and /metrics counts the cached tokens.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, deadline, metrics } from './lib.mjs';

deadline(120000);
const BLOCK = 16;  // the server's KV block size: the cache works in whole blocks
const system = 'You are a speechwriter for the President. Write in the plain, hopeful style of the State of the Union '
  + 'addresses, with short sentences and concrete promises to the American people, their farms and their factories.';
const messages = [{ role: 'system', content: system }, { role: 'user', content: 'What should we do about the economy?' }];

const server = await startServer([], { model: null });
const plain = await startServer(['--no-prefix-cache'], { model: null });
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
const uncached = new OpenAI({ baseURL: plain.baseURL, apiKey: 'unused' });
test.after(async () => {
  for (const s of [server, plain]) { const e = await s.stop(); assert.equal(e.code, 0, `server exit ${JSON.stringify(e)}`); }
});

const ask = (c, extra = {}) => c.chat.completions.create({ messages, max_tokens: 12, temperature: 0, ...extra });

test('a repeated chat request is served from the prefix cache, with the same answer', async () => {
  const first = await ask(client);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  const P = first.usage.prompt_tokens;
  assert.ok(P > 3 * BLOCK, `prompt of ${P} tokens`);
  const second = await ask(client);
  assert.equal(second.usage.prompt_tokens, P);
  // Every whole block but the one holding the last prompt token (which is always computed).
  assert.equal(second.usage.prompt_tokens_details.cached_tokens, Math.floor((P - 1) / BLOCK) * BLOCK);
  assert.equal(second.choices[0].message.content, first.choices[0].message.content);

  const ref = await ask(uncached);
  assert.equal(ref.choices[0].message.content, first.choices[0].message.content);
  assert.equal((await ask(uncached)).usage.prompt_tokens_details.cached_tokens, 0);

  // Streamed, with the usage chunk.
  let text = '', usage = null;
  for await (const c of await ask(client, { stream: true, stream_options: { include_usage: true } })) {
    if (c.usage) usage = c.usage;
    text += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(text, first.choices[0].message.content);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0);
});

test('a second turn reuses the first turn, a shared system prompt is reused', async () => {
  const first = await ask(client);
  const turn2 = await client.chat.completions.create({
    messages: [...messages, { role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: 'And jobs?' }],
    max_tokens: 8, temperature: 0,
  });
  assert.ok(turn2.usage.prompt_tokens_details.cached_tokens >= Math.floor(first.usage.prompt_tokens / BLOCK) * BLOCK - BLOCK);
  const other = await client.chat.completions.create({
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'Thank the farmers.' }], max_tokens: 8, temperature: 0,
  });
  const shared = other.usage.prompt_tokens_details.cached_tokens;
  assert.ok(shared >= 2 * BLOCK && shared < other.usage.prompt_tokens, `cached ${shared} of ${other.usage.prompt_tokens}`);
});

test('Anthropic usage reports cache_read_input_tokens', async () => {
  const anthropic = new Anthropic({ baseURL: server.url, apiKey: 'unused' });
  // cache_control markers are accepted (every prefix is cached anyway).
  const req = { model: 'm', max_tokens: 8, temperature: 0, system: [{ type: 'text', text: system, cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Speak to the soldiers.' }] };
  const a = await anthropic.messages.create(req);
  const b = await anthropic.messages.create(req);
  assert.ok(b.usage.cache_read_input_tokens >= 2 * BLOCK, JSON.stringify(b.usage));
  assert.equal(b.usage.cache_read_input_tokens % BLOCK, 0);
  // Anthropic's input_tokens leaves out what was read from the cache: the two add up to the prompt.
  assert.equal(b.usage.input_tokens + b.usage.cache_read_input_tokens, a.usage.input_tokens + a.usage.cache_read_input_tokens);
  assert.ok(b.usage.input_tokens < a.usage.input_tokens + a.usage.cache_read_input_tokens);
  assert.deepEqual(b.content, a.content);
});

test('/metrics counts prefix-cache hits', async () => {
  const before = (await metrics(server.url)).arbor_prefix_cache_hit_tokens_total;
  const r = await ask(client);
  const after = (await metrics(server.url)).arbor_prefix_cache_hit_tokens_total;
  assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0);
  assert.equal(after - before, r.usage.prompt_tokens_details.cached_tokens);
  assert.equal((await metrics(plain.url)).arbor_prefix_cache_hit_tokens_total, 0);
  // Finished requests leave their full blocks cached; the server without the cache keeps none.
  assert.ok((await metrics(server.url)).arbor_kv_blocks_cached > 0);
  assert.equal((await metrics(plain.url)).arbor_kv_blocks_cached, 0);
});
