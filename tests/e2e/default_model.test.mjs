// The shipped default model through the server: `arbor serve` with no --model serves
// models/arbor-tiny-sotu, and a greedy chat request returns transformers' greedy continuation
// (golden_greedy.json, recorded by tools/default_model) as text, through the official openai SDK.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SRC, startServer, deadline } from './lib.mjs';

deadline(90000);
const golden = JSON.parse(fs.readFileSync(path.join(SRC, 'models', 'arbor-tiny-sotu', 'golden_greedy.json'), 'utf8'));
const chat = golden.cases.find((c) => c.messages);
const server = await startServer([], { model: null });  // no --model: the default model
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
test.after(async () => { const e = await server.stop(); assert.equal(e.code, 0, `server exit ${JSON.stringify(e)}`); });

test('the default model is served', async () => {
  const list = await client.models.list();
  assert.equal(list.data[0].id, 'arbor-tiny-sotu');
});

test('greedy chat matches the transformers golden', async () => {
  const r = await client.chat.completions.create({
    messages: chat.messages, temperature: 0, max_tokens: chat.greedy_ids.length,
  });
  assert.equal(r.usage.prompt_tokens, chat.prompt_ids.length);
  assert.equal(r.usage.completion_tokens, chat.greedy_ids.length);
  assert.equal(r.choices[0].message.content, chat.greedy_text);
  assert.equal(r.choices[0].finish_reason, 'length');
});
