// Abuse: thousands of malformed, truncated and mutated requests (raw sockets and JSON bodies), bounded in
// time; afterwards /health and a valid request still answer, no request got a 500, no connection leaked.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, deadline, post, rawRequest, metrics, sleep } from './lib.mjs';

deadline(90000);
// --max-tokens caps the mutated bodies that lose their max_tokens field.
const server = await startServer(['--max-batch', '4', '--ctx-size', '256', '--max-tokens', '4']);
test.after(async () => { const e = await server.stop(); assert.equal(e.code, 0); });

// Deterministic PRNG so a failure can be replayed.
let state = 12345;
const rnd = (n) => { state = (state * 1103515245 + 12345) & 0x7fffffff; return state % n; };
const valid = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, temperature: 0.5, stop: ['x'], logit_bias: { 5: 1 } });

function rawCase(i) {
  const body = valid;
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
  switch (i % 10) {
    case 0: return { bytes: Buffer.from([...Array(1 + rnd(300))].map(() => rnd(256))), half: true };  // random bytes
    case 1: return { bytes: head.slice(0, rnd(head.length)), half: true };                 // truncated headers
    case 2: return { bytes: head + body.slice(0, rnd(body.length)), half: true };          // truncated body
    case 3: return { bytes: `GET / HTTP/1.1\r\nX: ${'a'.repeat(70000)}\r\n\r\n` };          // header too large
    case 4: return { bytes: `POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n` };
    case 5: return { bytes: `POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n` };
    case 6: return { bytes: `BREW /pot HTTP/9.9\r\n\r\n` };
    case 7: return { bytes: `POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n` };
    case 8: return { bytes: `\r\n\r\n\r\n\r\n` };
    default: {  // valid framing, mutated JSON body
      const b = Buffer.from(body);
      for (let k = 0; k < 1 + rnd(4); k++) b[rnd(b.length)] = rnd(256);
      return { bytes: Buffer.concat([Buffer.from(head), b]), half: true };
    }
  }
}

test('thousands of malformed requests, then the server still works', async () => {
  const t0 = Date.now();
  const statuses = {};
  let raw = 0;
  // Raw socket abuse, 32 connections at a time.
  for (let batch = 0; batch < 50 && Date.now() - t0 < 12000; batch++) {
    const answers = await Promise.all([...Array(32)].map((_, j) => {
      const c = rawCase(batch * 32 + j);
      return rawRequest(server.port, c.bytes, { ms: 1500, half: c.half });
    }));
    raw += answers.length;
    for (const a of answers) {
      const m = a.match(/^HTTP\/1\.1 (\d+)/);
      if (m) statuses[m[1]] = (statuses[m[1]] || 0) + 1;
    }
  }
  // Well-framed requests with wrong JSON: every answer must be a 4xx with an error object.
  const mutations = [];
  for (let i = 0; i < 600 && Date.now() - t0 < 18000; i++) {
    const b = Buffer.from(valid);
    for (let k = 0; k < 1 + rnd(3); k++) b[rnd(b.length)] = 32 + rnd(95);
    mutations.push(b);
  }
  let json = 0;
  for (let i = 0; i < mutations.length; i += 24) {
    const rs = await Promise.all(mutations.slice(i, i + 24).map((b) => post(`${server.baseURL}/chat/completions`, b)));
    for (const r of rs) {
      statuses[r.status] = (statuses[r.status] || 0) + 1;
      assert.ok(r.status === 200 || (r.status >= 400 && r.status < 500), `status ${r.status}: ${r.text}`);
      if (r.status !== 200) assert.ok(r.body?.error?.message, r.text);
      json++;
    }
  }
  console.log(`abuse: ${raw} raw + ${json} JSON requests in ${Date.now() - t0} ms; statuses ${JSON.stringify(statuses)}`);
  assert.ok(raw + json >= 1500, `only ${raw + json} requests`);
  assert.equal(statuses['500'] ?? 0, 0);

  const h = await fetch(`${server.url}/health`);
  assert.equal(h.status, 200);
  const r = await post(`${server.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'still there?' }], max_tokens: 3 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.usage.completion_tokens, 3);
  for (let i = 0; i < 100 && (await metrics(server.url)).arbor_kv_blocks_used > 0; i++) await sleep(20);
  assert.equal((await metrics(server.url)).arbor_kv_blocks_used, 0);
});
