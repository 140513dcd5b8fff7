// CORS, for clients running in a browser: a preflight (OPTIONS) is answered 204 with the methods and
// the headers asked for, before any API key check; answers to an allowed Origin carry
// Access-Control-Allow-Origin, streams included. Default: any origin; --allowed-origins narrows it.
import test from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, deadline } from './lib.mjs';

deadline(90000);

// One request with raw headers (fetch may not send Origin); resolves {status, headers, body}.
function request(port, method, path, headers = {}, body = null) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, headers }, (res) => {
      let data = '';
      res.on('data', (d) => (data += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    if (body) req.end(JSON.stringify(body)); else req.end();
  });
}
const portOf = (s) => Number(new URL(s.baseURL).port);
const chat = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };

test('any origin by default: preflight, plain and streamed answers', async () => {
  const s = await startServer(['--api-key', 'sekrit']);
  try {
    const port = portOf(s), origin = 'http://localhost:3000';
    const pre = await request(port, 'OPTIONS', '/v1/chat/completions', {
      Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type',
    });
    assert.equal(pre.status, 204);  // no API key on a preflight, and still answered
    assert.equal(pre.headers['access-control-allow-origin'], '*');
    assert.match(pre.headers['access-control-allow-methods'], /POST/);
    assert.equal(pre.headers['access-control-allow-headers'], 'authorization, content-type');
    assert.equal(pre.headers['content-length'], undefined);
    const auth = { Origin: origin, 'content-type': 'application/json', authorization: 'Bearer sekrit' };
    const plain = await request(port, 'POST', '/v1/chat/completions', auth, chat);
    assert.equal(plain.status, 200, plain.body);
    assert.equal(plain.headers['access-control-allow-origin'], '*');
    const streamed = await request(port, 'POST', '/v1/chat/completions', auth, { ...chat, stream: true });
    assert.equal(streamed.status, 200);
    assert.equal(streamed.headers['access-control-allow-origin'], '*');
    assert.match(streamed.body, /data: \[DONE\]/);
    const denied = await request(port, 'POST', '/v1/chat/completions', { Origin: origin, 'content-type': 'application/json' }, chat);
    assert.equal(denied.status, 401);  // errors carry it too, so the page can read them
    assert.equal(denied.headers['access-control-allow-origin'], '*');
    const noOrigin = await request(port, 'GET', '/health');
    assert.equal(noOrigin.headers['access-control-allow-origin'], undefined);
  } finally {
    await s.stop();
  }
});

test('--allowed-origins: listed origins are echoed, others get no CORS headers', async () => {
  const s = await startServer(['--allowed-origins', 'http://a.example, https://b.example:8443/']);
  try {
    const port = portOf(s);
    for (const origin of ['http://a.example', 'https://b.example:8443']) {
      const r = await request(port, 'GET', '/v1/models', { Origin: origin });
      assert.equal(r.status, 200);
      assert.equal(r.headers['access-control-allow-origin'], origin);
      assert.equal(r.headers.vary, 'Origin');
    }
    const other = await request(port, 'GET', '/v1/models', { Origin: 'http://evil.example' });
    assert.equal(other.status, 200);
    assert.equal(other.headers['access-control-allow-origin'], undefined);
    const pre = await request(port, 'OPTIONS', '/v1/models', { Origin: 'http://evil.example', 'Access-Control-Request-Method': 'GET' });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers['access-control-allow-origin'], undefined);
    assert.equal(pre.headers['access-control-allow-methods'], undefined);
  } finally {
    await s.stop();
  }
});
