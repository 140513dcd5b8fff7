// Robustness: OpenAI-style errors that name the field (bad JSON, wrong types, 413, invalid UTF-8, empty
// messages, unknown roles, absurd numbers, 404/405), KV admission (400 with numbers, 429 when full), API key,
// client disconnect cancels and frees KV, SIGINT with a stream in flight exits 0.
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, deadline, post, metrics, sleep } from './lib.mjs';

deadline(120000);
const server = await startServer(['--max-batch', '2', '--max-queue', '1', '--kv-blocks', '40']);
const chat = `${server.baseURL}/chat/completions`;
const ok = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
test.after(async () => { await server.stop(); });

function assertError(r, status, param, re) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.body && r.body.error, r.text);
  const e = r.body.error;
  assert.equal(typeof e.message, 'string');
  assert.ok('type' in e && 'param' in e && 'code' in e, r.text);
  if (param !== undefined) assert.equal(e.param, param, r.text);
  if (re) assert.match(e.message, re);
}

test('malformed bodies', async () => {
  assertError(await post(chat, '{"messages": [', {}), 400, null, /not valid JSON/);
  assertError(await post(chat, '', {}), 400, null, /empty/);
  assertError(await post(chat, '[1,2]', {}), 400, null, /JSON object/);
  const bad = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]);
  assertError(await post(chat, bad), 400, null, /UTF-8/);
  const huge = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(9 << 20) }] });
  const r = await post(chat, huge);
  assert.equal(r.status, 413);
  assert.match(r.body.error.message, /exceeds the limit/);
});

test('fields are validated and named', async () => {
  const cases = [
    [{ messages: [] }, 'messages', /at least one/],
    [{}, 'messages', /required/],
    [{ messages: 'hi' }, 'messages', /array/],
    [{ messages: [{ role: 'wizard', content: 'x' }] }, 'messages[0].role', /wizard/],
    [{ messages: [{ role: 'user' }] }, 'messages[0].content', /required/],
    [{ messages: [{ role: 'user', content: 5 }] }, 'messages[0].content', /string/],
    [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 'messages[0].content[0]', /text-only/],
    [{ ...ok, temperature: 'hot' }, 'temperature', /number/],
    [{ ...ok, temperature: 1e308 }, 'temperature', /between/],
    [{ ...ok, top_p: 5 }, 'top_p', /between/],
    [{ ...ok, max_tokens: -5 }, 'max_tokens', /between/],
    [{ ...ok, max_tokens: 1.5 }, 'max_tokens', /integer/],
    [{ ...ok, max_tokens: 1e30 }, 'max_tokens', /integer/],
    [{ ...ok, n: 1000 }, 'n', /between/],
    [{ ...ok, stop: 5 }, 'stop', /string/],
    [{ ...ok, seed: 'x' }, 'seed', /integer/],
    [{ ...ok, logit_bias: { abc: 1 } }, 'logit_bias', /token id/],
    [{ ...ok, logit_bias: { 5: 1000 } }, 'logit_bias', /between/],
    [{ ...ok, top_logprobs: 3 }, 'top_logprobs', /logprobs/],
    [{ ...ok, stream: 'yes' }, 'stream', /boolean/],
    [{ ...ok, tools: [{ type: 'function' }] }, 'tools[0].function', /required/],
    [{ ...ok, reasoning_effort: 'extreme' }, 'reasoning_effort', /extreme/],
  ];
  for (const [body, param, re] of cases) assertError(await post(chat, body), 400, param, re);
  assertError(await post(`${server.baseURL}/completions`, { prompt: [1, -3] }), 400, 'prompt', /token id/);
  // Unknown fields are ignored.
  assert.equal((await post(chat, { ...ok, store: false, user: 'u', metadata: { a: 1 }, frobnicate: true })).status, 200);
});

test('routes, methods, SDK error shape', async () => {
  const r404 = await fetch(`${server.url}/v1/nothing`);
  assert.equal(r404.status, 404);
  assert.equal((await fetch(chat)).status, 405);
  const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'x' });
  await assert.rejects(client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], temperature: -1 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'temperature');
    assert.equal(e.type, 'invalid_request_error');
    return true;
  });
});

test('KV admission: never fits -> 400 with numbers; full -> 429', async () => {
  // 40 blocks of 16 tokens = 640 tokens.
  assertError(await post(chat, { ...ok, max_tokens: 900 }), 400, 'max_tokens', /needs \d+ KV blocks .* server has 40/);
  // Without max_tokens the budget shrinks to what the pool holds.
  const r = await post(chat, { messages: ok.messages, temperature: 0, max_tokens: undefined, stop: ['\u0000'] });
  assert.equal(r.status, 200, r.text);
  // 2 running (each takes 16 blocks) + 1 queued; the rest get 429.
  const ctrl = new AbortController();
  const reqs = [...Array(6)].map(() => fetch(chat, { method: 'POST', signal: ctrl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...ok, max_tokens: 250 }) }).then(async (x) => ({ status: x.status, body: await x.text() }), () => ({ status: 'aborted' })));
  const first = await Promise.race(reqs);
  assert.equal(first.status, 429, JSON.stringify(first));
  assert.match(JSON.parse(first.body).error.message, /full/);
  ctrl.abort();
  await Promise.all(reqs);
  for (let i = 0; i < 100 && (await metrics(server.url)).arbor_kv_blocks_used > 0; i++) await sleep(20);
  assert.equal((await metrics(server.url)).arbor_kv_blocks_used, 0);
});

test('client disconnect cancels and frees KV (stream and non-stream)', async () => {
  for (const stream of [true, false]) {
    const before = (await metrics(server.url)).arbor_sequences_cancelled_total;
    const ctrl = new AbortController();
    const res = fetch(chat, { method: 'POST', signal: ctrl.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...ok, max_tokens: 600, stream }) });
    if (stream) {
      const r = await res;
      const reader = r.body.getReader();
      await reader.read();
      await reader.read();
    } else {
      for (let i = 0; i < 100 && (await metrics(server.url)).arbor_requests_running === 0; i++) await sleep(10);
    }
    assert.equal((await metrics(server.url)).arbor_requests_running, 1);
    ctrl.abort();
    await res.catch(() => {});
    const t0 = Date.now();
    let m;
    for (let i = 0; i < 100; i++) {
      m = await metrics(server.url);
      if (m.arbor_kv_blocks_used === 0 && m.arbor_requests_running === 0) break;
      await sleep(10);
    }
    assert.equal(m.arbor_kv_blocks_used, 0, `stream=${stream}`);
    assert.equal(m.arbor_sequences_cancelled_total, before + 1);
    assert.ok(Date.now() - t0 < 1000);
  }
});

test('API key', async () => {
  const s = await startServer(['--api-key', 'sekrit', '--ctx-size', '128']);
  try {
    const r = await post(`${s.baseURL}/chat/completions`, ok);
    assert.equal(r.status, 401);
    assert.equal(r.body.error.type, 'authentication_error');
    assert.equal((await post(`${s.baseURL}/chat/completions`, ok, { authorization: 'Bearer sekrit' })).status, 200);
    assert.equal((await fetch(`${s.url}/health`)).status, 200);
  } finally {
    await s.stop();
  }
});

test('SIGINT with a stream in flight: the stream ends, exit code 0', async () => {
  const s = await startServer(['--ctx-size', '1024']);
  const r = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...ok, max_tokens: 900, stream: true }) });
  const reader = r.body.getReader();
  await reader.read();
  const exit = s.stop('SIGINT');
  let text = '';
  for (;;) {
    const { done, value } = await reader.read().catch(() => ({ done: true }));
    if (done) break;
    text += Buffer.from(value).toString();
  }
  const e = await exit;
  assert.equal(e.code, 0, JSON.stringify(e) + s.log());
  assert.match(s.log(), /SIGINT received/);
  // The cancelled stream ends with one error frame (api.md: errors after the stream started).
  assert.match(text, /data: \{"error":\{[^\n]*shutting down/);
});
