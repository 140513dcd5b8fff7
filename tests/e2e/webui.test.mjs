// The chat page at GET /: browsers get src/server/webui/index.html byte for byte (with a strict
// content security policy), other clients the status line. The page's own client functions (request
// body, SSE reading, streaming, stats) run here in a VM context against a real server, and must give
// what the non-streaming API gives for the same greedy request. Its DOM wiring runs on a minimal fake
// DOM: clicks, streamed text, stats, the API key prompt. webui_browser.test.mjs drives the same page in a
// real browser (layout, focus, scrolling, keys, stopping).
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

test('errors are worded for people where the server words them for developers', () => {
  const p = pageFunctions();
  const status = (n, message = 'invalid or missing API key (send ...)') => Object.assign(new Error(message), { status: n });
  assert.match(p.errorText(status(401)), /^This server needs an API key\./);
  assert.match(p.errorText(status(401), { keyGiven: true }), /^The server did not accept this API key\./);
  assert.match(p.errorText(status(429, 'queue full (64 waiting)')), /busy/);
  assert.match(p.errorText(new TypeError('Failed to fetch')), /^The connection to the server failed \(Failed to fetch\)/);
  const context = status(400, "This model's maximum context length is 4096 tokens. However, your prompt has 5000 tokens");
  assert.equal(p.errorText(context), context.message);  // already written for people: shown as it is
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

// A minimal DOM: the page's elements by id (from its HTML), created elements, text, events. Enough to
// run the page's init() and click through a conversation without a browser.
class FakeElement {
  constructor(tag, id = '') {
    Object.assign(this, { tagName: tag, id, children: [], listeners: {}, style: {}, attributes: {}, className: '', hidden: false, value: '', _text: '' });
    Object.assign(this, { scrollTop: 0, scrollHeight: 0, clientHeight: 0, parent: null });
  }
  get textContent() { return this.children.length ? this.children.map((c) => c.textContent).join('') : this._text; }
  set textContent(t) { this.children = []; this._text = String(t); }
  adopt(els) { for (const el of els) el.parent = this; return els; }
  append(...els) { this.children.push(...this.adopt(els)); }
  appendChild(el) { this.append(el); return el; }
  prepend(el) { this.children.unshift(...this.adopt([el])); }
  remove() { if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this); this.parent = null; }
  setAttribute(k, v) { this.attributes[k] = String(v); }
  removeAttribute(k) { delete this.attributes[k]; }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  dispatch(type, extra = {}) { for (const fn of this.listeners[type] || []) fn({ key: '', shiftKey: false, isComposing: false, preventDefault() {}, ...extra }); }
  focus() {}
}

function runPage(base) {
  const byId = new Map([...page.matchAll(/<(\w+)[^>]*\sid="([^"]+)"/g)].map(([, tag, id]) => [id, new FakeElement(tag, id)]));
  for (const m of page.matchAll(/<(\w+)[^>]*\sid="([^"]+)"[^>]*\shidden[\s>]/g)) byId.get(m[2]).hidden = true;
  const document = { getElementById: (id) => byId.get(id) ?? null, createElement: (tag) => new FakeElement(tag) };
  const store = new Map();
  const localStorage = { getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, String(v)) };
  const pageFetch = (url, opts) => fetch(url.startsWith('/') ? base + url : url, opts);
  const script = page.slice(page.indexOf('<script>') + 8, page.lastIndexOf('</script>'));
  vm.runInContext(script, vm.createContext({ fetch: pageFetch, TextDecoder, AbortController, console, document, localStorage }));
  return byId;
}

async function until(cond, what) {
  for (let i = 0; i < 2000; i++) {  // up to 20 s
    if (cond()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail(`timed out waiting for ${what}`);
}

test('the page, clicked through: model shown, a reply streamed in, stats, new chat; a key asked for, the message kept', async () => {
  const s = await startServer();
  try {
    const el = runPage(s.url);
    await until(() => /context/.test(el.get('model').textContent), 'the model line');
    assert.match(el.get('model').textContent, /^qwen3-tiny · context \d+$/);
    el.get('temperature').value = '0';
    el.get('max_tokens').value = '6';
    el.get('input').value = 'Say something.';
    el.get('send').dispatch('click');
    assert.equal(el.get('send').textContent, 'Stop');
    await until(() => el.get('send').textContent === 'Send', 'the reply to end');
    const log = el.get('log').children;
    assert.equal(log.length, 2);
    assert.equal(log[0].className, 'msg user');
    assert.equal(log[0].textContent, 'Say something.');
    assert.equal(log[1].className, 'msg assistant');
    const ref = await post(`${s.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'Say something.' }], temperature: 0, max_tokens: 6 });
    assert.equal(log[1].textContent, ref.body.choices[0].message.content);
    assert.match(el.get('stats').textContent, /prompt tokens · 6 generated · [0-9.]+ tok\/s · length$/);
    assert.equal(el.get('input').value, '');
    el.get('new').dispatch('click');
    assert.equal(el.get('log').children.length, 0);
  } finally {
    await s.stop();
  }
  const locked = await startServer(['--api-key', 'k2']);
  try {
    const el = runPage(locked.url);
    await until(() => el.get('model').textContent === 'needs an API key', 'the key prompt');
    assert.equal(el.get('keylabel').hidden, false);
    const log = el.get('log');
    el.get('input').value = 'Hello?';
    el.get('input').dispatch('keydown', { key: 'Enter' });
    await until(() => el.get('send').textContent === 'Send' && log.children[0]?.className === 'msg error', 'the refusal');
    assert.equal(log.children.length, 1);  // the refused turn's own bubble is gone: it is not part of the conversation
    assert.equal(log.children[0].textContent, 'This server needs an API key. Enter it in the API key box at the top, then send again. Your message is back in the box below.');
    assert.equal(el.get('input').value, 'Hello?');
    el.get('key').value = 'not-it';
    el.get('key').dispatch('change');
    await until(() => el.get('model').textContent === 'API key not accepted', 'the refused key');
    el.get('key').value = 'k2';
    el.get('key').dispatch('change');
    await until(() => /context/.test(el.get('model').textContent), 'the model line after the key');
    el.get('max_tokens').value = '3';
    el.get('input').dispatch('keydown', { key: 'Enter', isComposing: true });  // an input method's Enter: not a send
    assert.equal(el.get('send').textContent, 'Send');
    el.get('input').dispatch('keydown', { key: 'Enter' });
    assert.equal(el.get('send').textContent, 'Stop');
    await until(() => el.get('send').textContent === 'Send', 'the reply after the key');
    assert.deepEqual(log.children.map((c) => c.className), ['msg error', 'msg user', 'msg assistant']);
    assert.equal(log.children[1].textContent, 'Hello?');
    assert.match(el.get('stats').textContent, / 3 generated · .*length$/);
  } finally {
    await locked.stop();
  }
});
