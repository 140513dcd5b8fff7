// The OpenAI surface through the official `openai` SDK and curl: models, chat (stream and not),
// completions, usage, raw SSE framing, interleaved concurrent streams, batch-1 parity with `arbor generate`.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';
import { ARBOR, startServer, deadline, parseSSE, testModel } from './lib.mjs';

deadline(120000);
const server = await startServer(['--max-batch', '4', '--ctx-size', '1024']);
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
const messages = [{ role: 'user', content: 'Say hello.' }];
test.after(async () => { const e = await server.stop(); assert.equal(e.code, 0, `server exit ${JSON.stringify(e)}`); });

test('health and models', async () => {
  const h = await fetch(`${server.url}/health`);
  assert.equal(h.status, 200);
  assert.deepEqual(await h.json(), { status: 'ok' });
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  const m = list.data[0];
  assert.equal(m.id, 'qwen3-tiny');
  assert.equal(m.context_window, 1024);
  assert.equal(m.reasoning, true);
  const one = await client.models.retrieve('qwen3-tiny');
  assert.equal(one.id, 'qwen3-tiny');
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404);
});

test('chat non-stream', async () => {
  const r = await client.chat.completions.create({ model: 'anything', messages, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'qwen3-tiny');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 6);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

test('chat stream equals non-stream (greedy), usage chunk, [DONE]', async () => {
  const ref = await client.chat.completions.create({ messages, max_completion_tokens: 8, temperature: 0 });
  const stream = await client.chat.completions.create({ messages, max_completion_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let text = '', role = null, finish = null, usage = null, n = 0;
  for await (const c of stream) {
    n++;
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, ref.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 8);
  assert.ok(n >= 3);
});

test('completions: string and token-id prompts, stream', async () => {
  const r = await client.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.completion_tokens, 5);
  assert.ok(r.choices[0].text.length > 0);
  const s = await client.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
  const ids = await client.completions.create({ model: 'x', prompt: [9707, 11, 1879], max_tokens: 3, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
});

test('raw SSE framing (curl)', () => {
  const out = execFileSync('curl', ['-sN', '-H', 'content-type: application/json', `${server.baseURL}/chat/completions`, '-d',
    JSON.stringify({ messages, max_tokens: 3, temperature: 0, stream: true })], { encoding: 'utf8' });
  assert.ok(out.endsWith('data: [DONE]\n\n'), JSON.stringify(out.slice(-40)));
  const blocks = out.split('\n\n').filter(Boolean);
  for (const b of blocks) assert.match(b, /^data: /);
  const ev = parseSSE(out);
  assert.equal(ev[0].data.choices[0].delta.role, 'assistant');
  assert.equal(ev.at(-2).data.choices[0].finish_reason, 'length');
  assert.equal(ev.at(-1).data, '[DONE]');
});

test('a lone request gives exactly what `arbor generate` gives', async () => {
  const prompt = [9707, 11, 1879, 0, 42, 1000, 77];
  for (const [temp, seed] of [[0, 0], [0.9, 1234]]) {
    const out = execFileSync(ARBOR, ['generate', '--model', testModel(), '--threads', '1', '--prompt-ids', prompt.join(','), '--max-tokens', '10',
      '--temperature', String(temp), '--seed', String(seed)], { encoding: 'utf8' });
    const want = out.split('\n')[0].split(',').map(Number);
    const r = await client.completions.create({ prompt, max_tokens: 10, temperature: temp, seed, logprobs: 0,
      return_tokens_as_token_ids: true });
    const got = r.choices[0].logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));
    assert.deepEqual(got, want, `temperature ${temp}`);
  }
});

test('two concurrent streams interleave', async () => {
  // b starts once a has streamed its first piece, and a is long (ignore_eos), so that on a loaded machine a cannot
  // finish before b is admitted (two 24-token streams started together once ran one after the other there).
  const order = [];
  let aStarted;
  const aFirst = new Promise((resolve) => { aStarted = resolve; });
  const run = async (tag, max_tokens) => {
    const s = await client.chat.completions.create({ messages, max_tokens, temperature: 0, stream: true, ignore_eos: true });
    for await (const c of s)
      if (c.choices[0]?.delta?.content) {
        order.push(tag);
        if (tag === 'a') aStarted();
      }
  };
  const a = run('a', 400);
  await aFirst;
  await Promise.all([a, run('b', 24)]);
  const lastA = order.lastIndexOf('a'), firstB = order.indexOf('b'), lastB = order.lastIndexOf('b'), firstA = order.indexOf('a');
  assert.ok(firstB < lastA && firstA < lastB, `streams ran one after the other: ${order.join('')}`);
});
