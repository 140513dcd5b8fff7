// The request log: one stderr line per API request with method, path, status and time, and for a
// generation its prompt, cached and generated tokens, time to first token and decode speed (figures
// checked against the response's usage); a generation the client stopped or left is marked cancelled,
// with what it generated until then; /health and /metrics stay out; --no-request-log silences it.
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

test('a generation the client stops is marked cancelled, with its figures', async () => {
  const s = await startServer();
  try {
    // Streamed: the client reads a few pieces, then closes the connection (a browser's Stop does this).
    const controller = new AbortController();
    const r = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: controller.signal,
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Go on forever.' }], max_tokens: 30000, ignore_eos: true, stream: true }),
    });
    assert.equal(r.status, 200);
    const reader = r.body.getReader();
    let pieces = 0;
    for (let text = ''; pieces < 5; ) {
      const { value } = await reader.read();
      text += new TextDecoder().decode(value);
      pieces = (text.match(/"content":"[^"]/g) || []).length;
    }
    controller.abort();
    const line = /server: POST \/v1\/chat\/completions 200 \d+\.\d{3} s; cancelled: the client went away; prompt (\d+) tokens \(0 cached\), (\d+) generated, first after \d+\.\d{3} s/;
    const log = await logAfter(s, line);
    assert.match(log, line);
    const [, prompt, generated] = log.match(line).map(Number);
    assert.ok(prompt > 0 && generated >= pieces && generated < 30000, `prompt ${prompt}, generated ${generated}, ${pieces} pieces read`);
    // Not streamed: answered 499 (client closed the request), which the client never reads.
    const quiet = new AbortController();
    const pending = fetch(`${s.baseURL}/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, signal: quiet.signal,
      body: JSON.stringify({ prompt: 'Once', max_tokens: 30000, ignore_eos: true }),
    }).catch((e) => e);
    await sleep(300);
    quiet.abort();
    assert.equal((await pending).name, 'AbortError');
    const unsent = /server: POST \/v1\/completions 499 \d+\.\d{3} s; cancelled: the client went away; prompt \d+ tokens \(\d+ cached\), \d+ generated/;
    assert.match(await logAfter(s, unsent), unsent);
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
