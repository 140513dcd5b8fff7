// The request log: one stderr line per API request with method, path, status and time, and for a
// generation its prompt, cached and generated tokens, time to first token and decode speed (figures
// checked against the response's usage); /health and /metrics stay out; --no-request-log silences it.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, deadline, post, sleep } from './lib.mjs';

deadline(90000);

async function logAfter(server, re) {
  for (let i = 0; i < 40 && !re.test(server.log()); i++) await sleep(25);  // the line follows the answer
  return server.log();
}

test('a line per request, with the generation figures', async () => {
  const s = await startServer();
  try {
    const r = await post(`${s.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'Count to ten.' }], max_tokens: 6, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    const u = r.body.usage;
    const line = new RegExp(`server: POST /v1/chat/completions 200 \\d+\\.\\d{3} s; prompt ${u.prompt_tokens} tokens \\(0 cached\\), ` +
      `${u.completion_tokens} generated, first after \\d+\\.\\d{3} s, \\d+\\.\\d tok/s after it\\n`);
    assert.match(await logAfter(s, line), line);
    await fetch(`${s.url}/health`);
    await fetch(`${s.url}/metrics`);
    await fetch(`${s.url}/nope`);
    const log = await logAfter(s, /GET \/nope 404/);
    assert.match(log, /server: GET \/nope 404 \d+\.\d{3} s\n/);
    assert.doesNotMatch(log, /server: GET \/(health|metrics)/);
  } finally {
    await s.stop();
  }
});

test('--no-request-log', async () => {
  const s = await startServer(['--no-request-log']);
  try {
    const r = await post(`${s.baseURL}/completions`, { prompt: 'Hello', max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
    await sleep(200);
    assert.doesNotMatch(s.log(), /server: POST/);
  } finally {
    await s.stop();
  }
});
