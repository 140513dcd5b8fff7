// Hardening against hostile clients, one test per defect an abuse run found: deeply nested JSON on every
// route (400 naming the limit, no crash), idle and slow clients (deadlines, the connection cap; /health, a
// real request and a stream in flight keep working), numbers that overflow a double (400 naming the
// field), ambiguous framing (400), and what the API key protects. Short deadlines via flags keep it quick.
import test from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { execFileSync } from 'node:child_process';
import { ARBOR, startServer, deadline, post, rawRequest, sleep } from './lib.mjs';

deadline(120000);
const server = await startServer(['--max-batch', '4', '--ctx-size', '512', '--max-tokens', '4',
  '--header-timeout', '1', '--body-timeout', '1', '--max-connections', '64']);
test.after(async () => { const e = await server.stop(); assert.equal(e.code, 0, server.log()); });

const chat = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
// Every route that reads a body, each with a body that is otherwise valid for it.
const routes = {
  '/v1/chat/completions': chat, '/chat/completions': chat,
  '/v1/completions': { prompt: 'hi', max_tokens: 2 }, '/completions': { prompt: 'hi', max_tokens: 2 },
  '/v1/messages': { ...chat, max_tokens: 2 }, '/v1/messages/count_tokens': chat,
  '/v1/responses': { input: 'hi', max_output_tokens: 2 }, '/responses': { input: 'hi', max_output_tokens: 2 },
  '/tokenize': { prompt: 'hi' }, '/v1/tokenize': { prompt: 'hi' }, '/detokenize': { tokens: [1, 2] }, '/v1/detokenize': { tokens: [1, 2] },
};
const nested = (depth) => '['.repeat(depth) + ']'.repeat(depth);
// The body of `valid` with one more member whose JSON text is `raw`.
const withMember = (valid, name, raw) => JSON.stringify(valid).slice(0, -1) + `,"${name}":${raw}}`;

async function alive() {
  const h = await fetch(`${server.url}/health`);
  assert.equal(h.status, 200);
}

test('deep nesting: 400 naming the limit on every route, the server lives', async () => {
  for (const [route, valid] of Object.entries(routes)) {
    assert.equal((await post(server.url + route, valid)).status, 200, route);
    for (const depth of [200, 60000]) {
      const r = await post(server.url + route, withMember(valid, 'metadata', nested(depth)));
      assert.equal(r.status, 400, `${route} depth ${depth}: ${r.text}`);
      assert.match(r.body.error?.message ?? r.body.error?.error?.message ?? JSON.stringify(r.body), /more than 128 levels deep/, route);
    }
  }
  // Three million deep (6 MB) in a known field; deep content in a chat message; deep tool-call arguments
  // sent as JSON text inside a string.
  let r = await post(`${server.baseURL}/responses`, `{"input":"hi","metadata":${nested(3000000)}}`);
  assert.equal(r.status, 400, r.text);
  r = await post(`${server.baseURL}/chat/completions`, { messages: [{ role: 'user', content: JSON.parse(nested(100)) }] });
  assert.equal(r.status, 400, r.text);
  r = await post(`${server.baseURL}/chat/completions`, `{"messages":[{"role":"user","content":${nested(5000)}}]}`);
  assert.equal(r.status, 400, r.text);
  r = await post(`${server.baseURL}/chat/completions`, { ...chat, messages: [chat.messages[0],
    { role: 'assistant', content: '', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: `{"a":${nested(50000)}}` } }] },
    { role: 'tool', tool_call_id: 'c', content: 'ok' }] });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.body.error.param, 'messages[1].tool_calls[0].function.arguments');
  // Just under the limit, through the chat template (tools' parameters and template kwargs reach tojson).
  const deepSchema = JSON.parse('{"type":"object","properties":{"x":'.repeat(40) + '{}' + '}}'.repeat(40));
  r = await post(`${server.baseURL}/chat/completions`, { ...chat, tools: [{ type: 'function', function: { name: 'f', parameters: deepSchema } }],
    chat_template_kwargs: { deep: JSON.parse(nested(120)) } });
  assert.ok(r.status === 200 || r.status === 400, r.text);
  // A GET ignores its body, however deep.
  assert.equal((await rawRequest(server.port, `GET /health HTTP/1.1\r\nContent-Length: 20000\r\nConnection: close\r\n\r\n${nested(10000)}`)).split('\r\n')[0], 'HTTP/1.1 200 OK');
  await alive();
});

test('numbers that overflow a double: 400 naming the field, on every route', async () => {
  for (const [route, valid] of Object.entries(routes)) {
    for (const [name, raw, where] of [['temperature', '1e400', 'temperature'], ['unknown_field', '{"deep":[0,-1e999]}', 'unknown_field.deep[1]']]) {
      const r = await post(server.url + route, withMember(valid, name, raw));
      assert.equal(r.status, 400, `${route} ${name}: ${r.text}`);
      const message = r.body.error?.message ?? JSON.stringify(r.body);
      assert.ok(message.includes(`'${where}' is a number too large for a double`), `${route}: ${message}`);
      assert.doesNotMatch(r.text, /json\.exception/);
    }
  }
  const r = await post(`${server.baseURL}/chat/completions`, '{"messages": [');
  assert.equal(r.status, 400);
  assert.doesNotMatch(r.text, /json\.exception/);
  await alive();
});

test('framing: conflicting Content-Length, or Content-Length with chunked, is 400', async () => {
  const body = JSON.stringify(chat);
  const head = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n';
  for (const framing of [`Content-Length: ${body.length}\r\nContent-Length: ${body.length + 1}\r\n`,
    `Content-Length: ${body.length}, ${body.length - 1}\r\n`,
    `Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n`,
    `Transfer-Encoding: chunked\r\nContent-Length: ${body.length}\r\n`,
    `Content-Length : ${body.length}\r\n`]) {
    const answer = await rawRequest(server.port, `${head}${framing}\r\n${body}`, { ms: 2000 });
    assert.match(answer, /^HTTP\/1\.1 400 /, framing);
  }
  // The same length twice is one length.
  const same = await rawRequest(server.port, `${head}Content-Length: ${body.length}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
  assert.match(same, /^HTTP\/1\.1 200 /);
});

// Opens a socket that sends `first`, then one byte every `everyMs`; resolves with what it was answered.
function slowClient(port, first, everyMs) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '', timer = null;
    const done = () => { clearInterval(timer); s.destroy(); resolve(got); };
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', done);
    s.on('close', done);
    s.on('connect', () => { s.write(first); timer = setInterval(() => s.write('a'), everyMs); });
    setTimeout(done, 6000);
  });
}

test('slow and idle clients: deadlines and the connection cap hold; /health, requests and streams keep working', async () => {
  // Malformed request lines get an answer at once, without the client closing its side.
  for (const bytes of ['GET / HTTP/1.1\n\n', Buffer.from([0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03])]) {
    const t0 = Date.now();
    const answer = await rawRequest(server.port, bytes, { ms: 3000 });
    assert.match(answer, /^HTTP\/1\.1 400 /);
    assert.ok(Date.now() - t0 < 1000, `${Date.now() - t0} ms`);
  }
  // A stream in flight before the attack.
  const stream = fetch(`${server.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...chat, max_tokens: 300, stream: true, ignore_eos: true }) }).then((r) => r.text());
  await sleep(100);
  // 300 connections (the cap is 64), each sending a byte every 200 ms, in headers and in bodies.
  const attackers = [];
  for (let i = 0; i < 300; i++) {
    attackers.push(slowClient(server.port, i % 2 ? 'GET /health HTTP/1.1\r\nX-Slow: ' : 'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{', 200));
    if (i % 50 === 49) await sleep(20);
  }
  await sleep(300);
  for (let round = 0; round < 5; round++) {
    let t0 = Date.now();
    const h = await fetch(`${server.url}/health`);
    assert.equal(h.status, 200);
    assert.ok(Date.now() - t0 < 1000, `/health took ${Date.now() - t0} ms`);
    t0 = Date.now();
    const r = await post(`${server.baseURL}/chat/completions`, chat);
    assert.equal(r.status, 200, r.text);
    await sleep(200);
  }
  const answers = await Promise.all(attackers);
  const timedOut = answers.filter((a) => /^HTTP\/1\.1 408 /.test(a)).length;
  const other = answers.filter((a) => a && !/^HTTP\/1\.1 408 /.test(a));
  assert.deepEqual(other, [], 'slow clients get a 408 or are closed to make room');
  assert.ok(timedOut > 0 && timedOut <= 64, `${timedOut} timed out`);
  const text = await stream;
  assert.match(text, /data: \[DONE\]/);
  await alive();
});

test('the API key covers everything but /health, /version and the chat page; the scheme is case-insensitive', async () => {
  const s = await startServer(['--api-key', 'sekrit', '--ctx-size', '128']);
  try {
    const get = (path, headers = {}) => fetch(s.url + path, { headers });
    for (const path of ['/metrics', '/v1/models']) {
      assert.equal((await get(path)).status, 401, path);
      assert.equal((await get(path, { authorization: 'Bearer wrong' })).status, 401, path);
      for (const auth of [{ authorization: 'Bearer sekrit' }, { authorization: 'bearer sekrit' }, { authorization: 'BEARER  sekrit' }, { 'x-api-key': 'sekrit' }])
        assert.equal((await get(path, auth)).status, 200, `${path} ${JSON.stringify(auth)}`);
    }
    for (const [route, valid] of Object.entries(routes)) {
      const r = await post(s.url + route, valid);
      assert.equal(r.status, 401, route);
      assert.equal((await post(s.url + route, valid, { authorization: 'bearer sekrit' })).status, 200, route);
    }
    assert.equal((await get('/nowhere')).status, 401);
    assert.equal((await get('/health')).status, 200);
    assert.equal((await get('/version')).status, 200);
    const page = await get('/', { accept: 'text/html' });
    assert.equal(page.status, 200);
    assert.match(await page.text(), /<html/i);
  } finally {
    await s.stop();
  }
});

test('serve --help says what the key protects and what the limits are', () => {
  const help = execFileSync(ARBOR, ['serve', '--help'], { encoding: 'utf8' });
  assert.match(help, /--api-key KEY[^]*\/metrics[^]*except \/health, \/version/);
  assert.match(help, /--header-timeout S/);
  assert.match(help, /--body-timeout S/);
  assert.match(help, /--max-connections N/);
  assert.match(help, /--max-client-connections N/);
  assert.match(help, /128 levels/);
});
