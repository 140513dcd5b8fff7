// Per-request sampling through the openai SDK: seed determinism whatever runs beside it, n, stop strings
// (excluded, also when streamed), logprobs/top_logprobs, logit_bias, penalties, top-k/top-p/min-p limits,
// max_tokens clamped to the context and a prompt that does not fit.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, deadline } from './lib.mjs';

deadline(120000);
const server = await startServer(['--max-batch', '8']);
const small = await startServer(['--ctx-size', '64']);
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
const smallClient = new OpenAI({ baseURL: small.baseURL, apiKey: 'unused' });
const messages = [{ role: 'user', content: 'Tell me a story about a tree.' }];
test.after(async () => { await server.stop(); await small.stop(); });

const ids = (r) => r.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));
const idReq = (extra) => client.completions.create({ prompt: [9707, 11, 1879, 13], max_tokens: 12, logprobs: 0,
  return_tokens_as_token_ids: true, ...extra });

test('same seed, same output, alone or beside other requests', async () => {
  const req = { messages, max_tokens: 16, temperature: 1.0, seed: 7 };
  const alone = (await client.chat.completions.create(req)).choices[0].message.content;
  const again = (await client.chat.completions.create(req)).choices[0].message.content;
  assert.equal(again, alone);
  const neighbours = [1, 2, 3].map((s) => client.chat.completions.create({ messages: [{ role: 'user', content: `other ${s} `.repeat(s * 10) }],
    max_tokens: 10 + s * 5, temperature: 1.0, seed: s }));
  const [busy] = await Promise.all([client.chat.completions.create(req), ...neighbours]);
  assert.equal(busy.choices[0].message.content, alone);
  const other = (await client.chat.completions.create({ ...req, seed: 8 })).choices[0].message.content;
  assert.notEqual(other, alone);
});

test('n choices', async () => {
  const r = await client.chat.completions.create({ messages, max_tokens: 6, temperature: 1.0, seed: 3, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 18);
  assert.ok(new Set(r.choices.map((c) => c.message.content)).size > 1);
  const s = await client.chat.completions.create({ messages, max_tokens: 6, temperature: 1.0, seed: 3, n: 3, stream: true });
  const text = ['', '', ''];
  for await (const c of s) for (const ch of c.choices) text[ch.index] += ch.delta.content ?? '';
  assert.deepEqual(text, r.choices.map((c) => c.message.content));
});

test('stop strings end the output and are excluded (stream and not)', async () => {
  const full = (await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0 })).choices[0].message.content;
  const chars = [...full];
  assert.ok(chars.length >= 4, full);
  const stop = chars.slice(2, 4).join('');
  const want = full.slice(0, full.indexOf(stop));
  const r = await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0, stop: [stop, 'never-matches'] });
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await client.chat.completions.create({ messages, max_tokens: 12, temperature: 0, stop, stream: true });
  let text = '', finish = null;
  for await (const c of s) { text += c.choices[0]?.delta?.content ?? ''; finish = c.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, want);
  assert.equal(finish, 'stop');
});

test('logprobs and top_logprobs', async () => {
  const r = await client.chat.completions.create({ messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);  // greedy picks the top token
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob);
    assert.deepEqual(Buffer.from(e.bytes).toString('utf8').length > 0, true);
  }
  const s = await client.chat.completions.create({ messages, max_tokens: 5, temperature: 0, logprobs: true, stream: true });
  let n = 0;
  for await (const c of s) n += c.choices[0]?.logprobs?.content?.length ?? 0;
  assert.equal(n, 5);
});

test('logit_bias forces a token', async () => {
  const r = await idReq({ temperature: 0, logit_bias: { 12345: 100 } });
  assert.deepEqual(ids(r), Array(12).fill(12345));
  const t = await idReq({ temperature: 1.0, seed: 1, logit_bias: { 777: 100 } });
  assert.deepEqual(ids(t), Array(12).fill(777));
});

test('penalties change a repetitive greedy output', async () => {
  const base = ids(await idReq({ temperature: 0 }));
  assert.ok(new Set(base).size < base.length, `expected repetition in ${base}`);
  for (const p of [{ frequency_penalty: 2 }, { presence_penalty: 2 }, { repetition_penalty: 1.5 }]) {
    const got = ids(await idReq({ temperature: 0, ...p }));
    assert.notDeepEqual(got, base, JSON.stringify(p));
    assert.ok(new Set(got).size > new Set(base).size, `${JSON.stringify(p)}: ${got}`);
  }
});

test('top_k=1, tiny top_p and min_p=1 are greedy', async () => {
  const greedy = ids(await idReq({ temperature: 0 }));
  for (const p of [{ top_k: 1 }, { top_p: 1e-9 }, { min_p: 1 }])
    assert.deepEqual(ids(await idReq({ temperature: 1.5, seed: 99, ...p })), greedy, JSON.stringify(p));
});

test('max_tokens is clamped to the context; a prompt that fills it is a 400', async () => {
  const r = await smallClient.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1e12, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, 64);
  await assert.rejects(smallClient.chat.completions.create({ messages: [{ role: 'user', content: 'word '.repeat(100) }] }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    assert.match(e.message, /64 tokens/);
    return true;
  });
});
