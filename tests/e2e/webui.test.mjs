// The chat page at GET /: browsers get src/server/webui/index.html byte for byte (with a strict
// content security policy), other clients the status line. The page's own client functions (request
// body, SSE reading, streaming, stats) run here in a VM context against a real server, and must give
// what the non-streaming API gives for the same greedy request.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';
import { SRC, startServer, deadline, post } from './lib.mjs';

deadline(90000);
const page = fs.readFileSync(path.join(SRC, 'src', 'server', 'webui', 'index.html'), 'utf8');

// The page's script, evaluated without a DOM: its functions become this context's globals.
function pageFunctions() {
  const script = page.slice(page.indexOf('<script>') + 8, page.lastIndexOf('</script>'));
  const ctx = vm.createContext({ fetch, TextDecoder, AbortController, console });
  vm.runInContext(script, ctx);
  return ctx;
}

test('GET / serves the page to browsers and a status line to others', async () => {
  const s = await startServer();
  try {
    const html = await fetch(`${s.url}/`, { headers: { accept: 'text/html,application/xhtml+xml' } });
    assert.equal(html.status, 200);
    assert.match(html.headers.get('content-type'), /^text\/html/);
    assert.match(html.headers.get('content-security-policy'), /default-src 'none'.*connect-src 'self'/);
    assert.equal(await html.text(), page);
    const plain = await fetch(`${s.url}/`);
    assert.match(await plain.text(), /^arbor is serving /);
  } finally {
    await s.stop();
  }
});

test('every element the page script looks up exists in the page', () => {
  const script = page.slice(page.indexOf('<script>'), page.lastIndexOf('</script>'));
  const used = [...script.matchAll(/\$\('([a-z_]+)'\)/g)].map((m) => m[1]);
  assert.ok(used.length >= 10, `${used.length} lookups`);
  for (const id of new Set(used)) assert.match(page, new RegExp(`id="${id}"`), `#${id} is looked up but not in the page`);
});

test("the page's streaming client gives the API's greedy reply, with stats", async () => {
  const s = await startServer();
  try {
    const p = pageFunctions();
    const messages = [{ role: 'user', content: 'Name three colours.' }];
    const body = p.chatBody({ messages, system: 'Be brief.', temperature: '0', maxTokens: '8' });
    assert.equal(body.messages[0].role, 'system');
    assert.equal(body.temperature, 0);
    assert.equal(body.max_tokens, 8);
    assert.equal(p.chatBody({ messages }).temperature, undefined);  // empty settings: the server's defaults
    let content = '';
    const result = await p.streamChat({ base: s.url, body, onDelta: (d) => { content += d.content; } });
    const ref = await post(`${s.baseURL}/chat/completions`, { ...body, stream: false, stream_options: undefined });
    assert.equal(ref.status, 200, ref.text);
    assert.equal(content, ref.body.choices[0].message.content);
    assert.deepEqual(result.usage.completion_tokens, ref.body.usage.completion_tokens);
    assert.equal(result.finish, ref.body.choices[0].finish_reason);
    assert.match(p.statsLine(result), new RegExp(`^${ref.body.usage.prompt_tokens} prompt tokens · ${ref.body.usage.completion_tokens} generated · [0-9.]+ tok/s · ${result.finish}$`));
  } finally {
    await s.stop();
  }
});

test("the page's client reports the server's errors and stops when aborted", async () => {
  const s = await startServer(['--api-key', 'k1']);
  try {
    const p = pageFunctions();
    const body = p.chatBody({ messages: [{ role: 'user', content: 'hi' }], maxTokens: '4' });
    await assert.rejects(p.streamChat({ base: s.url, body, onDelta: () => {} }), (e) => e.status === 401 && /API key/.test(e.message));
    const controller = new AbortController();
    const long = p.chatBody({ messages: [{ role: 'user', content: 'hi' }], maxTokens: '400' });
    long.ignore_eos = true;
    let pieces = 0;
    await assert.rejects(p.streamChat({ base: s.url, key: 'k1', body: long, signal: controller.signal,
      onDelta: () => { if (++pieces === 3) controller.abort(); } }), (e) => e.name === 'AbortError');
    assert.ok(pieces >= 3 && pieces < 400, `${pieces} pieces`);  // events already read may still arrive
  } finally {
    await s.stop();
  }
});
