// The chat page in a real browser: Debian's chromium (installed by scripts/install-deps), headless,
// driven by puppeteer-core (which never downloads a browser) against a real `arbor serve`. It checks what
// only a browser can tell: no page errors or CSP violations, focus, keys (Enter, Enter mid-reply, an
// input method's Enter), stopping for real, new chat mid-reply, scrolling while a reply streams, the
// layout of a 375 px phone screen, and the API-key flow. webui.test.mjs keeps testing the page's
// functions in Node. ARBOR_CHROMIUM names another browser binary; ARBOR_SCREENSHOTS, a folder for the
// phone-sized screenshots.
import test, { before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { startServer, deadline, post, sleep } from './lib.mjs';

deadline(180000);  // it runs in about 40 s on a loaded 2-core machine
const CHROMIUM = process.env.ARBOR_CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.ARBOR_SCREENSHOTS || '';

let browser, profile, server;
before(async () => {
  assert.ok(fs.existsSync(CHROMIUM), `no browser at ${CHROMIUM}: scripts/install-deps installs Debian's chromium (or set ARBOR_CHROMIUM)`);
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-chromium-'));
  // Flags for a root user on a machine without network: no sandbox, no GPU, and none of the browser's
  // own calls home (a fresh profile would otherwise try them).
  browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true, userDataDir: profile,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  server = await startServer();
});
after(async () => {
  await browser?.close();
  await server?.stop();
  if (profile) fs.rmSync(profile, { recursive: true, force: true });
});

// A fresh browser context (its own localStorage) with the page loaded. problems: page errors, console
// errors and CSP violations (a 401 answer's console line only where allowed); chats: the bodies the page
// posted to /v1/chat/completions.
// longReplies: the page's chat requests go out with ignore_eos, so that a reply runs to the context's
// end (~1000 tokens) instead of the test model's ~100-token greedy answers, which a fast machine
// finishes before a test can stop or scroll them. throttle (bytes/s): the browser receives the stream
// that slowly (a quick server has sent everything long before the reader scrolls).
async function openPage(s, { width = 1000, height = 700, mobile = false, allow401 = false, longReplies = false, throttle = 0 } = {}) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.setViewport({ width, height, isMobile: mobile, hasTouch: mobile, deviceScaleFactor: mobile ? 2 : 1 });
  if (longReplies) {
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')) r.continue({ postData: JSON.stringify({ ...JSON.parse(r.postData()), ignore_eos: true }) });
      else r.continue();
    });
  }
  if (throttle) await page.emulateNetworkConditions({ download: throttle, upload: 1e7, latency: 0 });
  const problems = [], chats = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error' && m.type() !== 'warn') return;
    if (allow401 && /status of 401/.test(m.text())) return;
    problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('request', (r) => { if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions')) chats.push(JSON.parse(r.postData())); });
  await page.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (e) => console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`));
  });
  const started = Date.now();
  const response = await page.goto(`${s.url}/`, { waitUntil: 'load' });
  assert.equal(response.status(), 200);
  const loadSeconds = (Date.now() - started) / 1000;
  return { page, problems, chats, loadSeconds, close: () => context.close() };
}

// What the page shows: the button, the stats, the bubbles, the input box, the model line.
const shown = (page) => page.evaluate(() => {
  const $ = (id) => document.getElementById(id);
  return { send: $('send').textContent, stats: $('stats').textContent, input: $('input').value, model: $('model').textContent,
           bubbles: [...$('log').children].map((d) => ({ cls: d.className, text: d.textContent })), focus: document.activeElement?.id };
});
const lastText = async (page) => (await shown(page)).bubbles.at(-1)?.text ?? '';
const waitFor = (page, fn, arg, timeout = 20000) => page.waitForFunction(fn, { timeout, polling: 10 }, arg);
const replyDone = (page) => waitFor(page, () => document.getElementById('send').textContent === 'Send' && document.getElementById('stats').textContent !== '');
const replyLonger = (page, n) => waitFor(page, (n) => (document.querySelector('#log .assistant:last-child')?.textContent.length ?? 0) > n, n);
async function setField(page, id, value) {
  await page.$eval(`#${id}`, (el) => { el.value = ''; });
  await page.type(`#${id}`, value);
}
async function sendMessage(page, text) {
  await page.focus('#input');
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
}

test('loads clean and labelled, streams the greedy reply with its stats, and a second turn carries the first', async () => {
  const { page, problems, chats, loadSeconds, close } = await openPage(server);
  try {
    assert.ok(loadSeconds < 10, `the page took ${loadSeconds} s to load`);
    await waitFor(page, () => /context/.test(document.getElementById('model').textContent));
    assert.match((await shown(page)).model, /^qwen3-tiny · context \d+$/);
    assert.equal((await shown(page)).focus, 'input');
    // What a screen reader gets: named fields, a conversation that is announced.
    await page.click('#sysbtn');
    const tree = await page.accessibility.snapshot();
    const boxes = [];
    (function walk(n) { if (n.role === 'textbox') boxes.push(n.name); (n.children || []).forEach(walk); })(tree);
    assert.ok(boxes.includes('Message') && boxes.includes('System prompt'), `text boxes named ${JSON.stringify(boxes)}`);
    assert.equal(await page.$eval('#sysbtn', (b) => b.getAttribute('aria-expanded')), 'true');
    assert.deepEqual(await page.$eval('#log', (l) => [l.getAttribute('role'), l.getAttribute('aria-live')]), ['log', 'polite']);

    await setField(page, 'temperature', '0');
    await setField(page, 'max_tokens', '6');
    const sentAt = Date.now();
    await sendMessage(page, 'Say something.');
    await replyDone(page);
    const first = await shown(page);
    const ref = await post(`${server.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'Say something.' }], temperature: 0, max_tokens: 6 });
    assert.deepEqual(first.bubbles, [{ cls: 'msg user', text: 'Say something.' }, { cls: 'msg assistant', text: ref.body.choices[0].message.content }]);
    assert.match(first.stats, /^\d+ prompt tokens · 6 generated · [0-9.]+ tok\/s · length$/);
    assert.equal(first.input, '');
    assert.ok(Date.now() - sentAt < 10000);

    await sendMessage(page, 'And then?');
    await replyDone(page);
    assert.deepEqual(chats.at(-1).messages, [{ role: 'user', content: 'Say something.' }, { role: 'assistant', content: ref.body.choices[0].message.content },
                                              { role: 'user', content: 'And then?' }]);
    assert.equal((await shown(page)).bubbles.length, 4);
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
});

test('Stop stops the server too; Enter mid-reply sends after stopping it; new chat mid-reply starts clean', async () => {
  const { page, problems, chats, close } = await openPage(server, { longReplies: true });
  try {
    await setField(page, 'temperature', '0');
    await setField(page, 'max_tokens', '20000');
    await sendMessage(page, 'Tell a long story.');
    await replyLonger(page, 40);
    assert.equal((await shown(page)).send, 'Stop');
    await page.click('#send');
    await waitFor(page, () => document.getElementById('stats').textContent === 'stopped');
    const stopped = await lastText(page);
    await sleep(300);
    assert.equal(await lastText(page), stopped, 'text kept coming after Stop');
    // The server saw the client go and says so in its request log, with what it generated until then.
    const logLine = /server: POST \/v1\/chat\/completions 200 \d+\.\d{3} s; cancelled: the client went away; prompt \d+ tokens \(\d+ cached\), (\d+) generated/;
    for (let i = 0; i < 40 && !logLine.test(server.log()); i++) await sleep(25);
    assert.match(server.log(), logLine);
    assert.ok(Number(server.log().match(logLine)[1]) < 20000);

    // An input method's Enter picks a word; it does not send (nor stop the reply).
    await sendMessage(page, 'Go on.');
    await replyLonger(page, 40);
    await page.type('#input', 'Stop there.');
    const posted = chats.length;
    await page.$eval('#input', (el) => el.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', isComposing: true, bubbles: true, cancelable: true })));
    await sleep(100);
    assert.equal(chats.length, posted);
    assert.equal((await shown(page)).send, 'Stop');
    assert.equal((await shown(page)).input, 'Stop there.');
    // A real Enter while the reply streams: the reply stops where it is and the message goes out.
    await page.keyboard.press('Enter');
    await waitFor(page, (n) => document.querySelectorAll('#log .msg').length === n, 6);
    const turn = await shown(page);
    assert.equal(turn.send, 'Stop');
    assert.equal(turn.input, '');
    assert.equal(chats.length, posted + 1);
    const partial = turn.bubbles[3].text;
    assert.ok(partial.length > 40, `${partial.length} characters before Enter`);
    assert.deepEqual(chats.at(-1).messages.slice(-3), [{ role: 'user', content: 'Go on.' }, { role: 'assistant', content: partial },
                                                       { role: 'user', content: 'Stop there.' }]);
    assert.equal(chats.at(-1).messages.length, 5);

    // New chat while that reply streams: nothing of the old conversation stays, on screen or in the next request.
    await replyLonger(page, 20);
    await page.click('#new');
    await waitFor(page, () => document.getElementById('send').textContent === 'Send');
    await sleep(100);
    let now = await shown(page);
    assert.deepEqual([now.bubbles, now.stats], [[], '']);
    await setField(page, 'max_tokens', '4');
    await sendMessage(page, 'Fresh start.');
    await replyDone(page);
    assert.deepEqual(chats.at(-1).messages, [{ role: 'user', content: 'Fresh start.' }]);
    now = await shown(page);
    assert.deepEqual(now.bubbles.map((b) => b.cls), ['msg user', 'msg assistant']);
    assert.match(now.stats, / 4 generated · .*length$/);
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
});

test('a reader who scrolls up while a reply streams stays there; at the bottom, it follows', async () => {
  // Narrow, so that the reply overflows the conversation within a few hundred tokens.
  const { page, problems, close } = await openPage(server, { width: 420, height: 520, longReplies: true, throttle: 8000 });
  try {
    await setField(page, 'temperature', '0');
    await setField(page, 'max_tokens', '20000');
    await sendMessage(page, 'Write a lot.');
    await waitFor(page, () => { const l = document.getElementById('log'); return l.scrollHeight > l.clientHeight + 150; });
    const geometry = () => page.$eval('#log', (l) => ({ top: l.scrollTop, gap: l.scrollHeight - l.scrollTop - l.clientHeight, length: l.textContent.length }));
    assert.ok((await geometry()).gap < 24, 'the log did not follow the reply while the reader was at the bottom');
    await page.mouse.move(200, 250);
    await page.mouse.wheel({ deltaY: -120 });
    await waitFor(page, () => { const l = document.getElementById('log'); return l.scrollHeight - l.scrollTop - l.clientHeight > 80; });
    const up = await geometry();
    await replyLonger(page, up.length + 150);
    const later = await geometry();
    // (A smooth scroll may still be moving up; toward the end the log must not move.)
    assert.ok(later.top <= up.top + 1 && later.gap > up.gap + 50, `the log moved while the reader was scrolled up: ${JSON.stringify({ up, later })}`);
    await page.mouse.wheel({ deltaY: 100000 });
    await waitFor(page, () => { const l = document.getElementById('log'); return l.scrollHeight - l.scrollTop - l.clientHeight < 24; });
    await replyLonger(page, later.length + 150);
    assert.ok((await geometry()).gap < 24, 'the log stopped following the reply after the reader came back to the bottom');
    await page.click('#send');
    await waitFor(page, () => document.getElementById('stats').textContent === 'stopped');
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
});

test('on a 375 px phone screen nothing overflows and the end of the reply stays in view with its stats', async () => {
  const { page, problems, close } = await openPage(server, { width: 375, height: 667, mobile: true });
  try {
    await waitFor(page, () => /context/.test(document.getElementById('model').textContent));
    await setField(page, 'temperature', '0');
    await setField(page, 'max_tokens', '300');
    await sendMessage(page, 'Tell me about trees.');
    await replyDone(page);
    if (SHOTS) {
      fs.mkdirSync(SHOTS, { recursive: true });
      await page.screenshot({ path: path.join(SHOTS, 'webui-375-reply.png') });
    }
    const g = await page.evaluate(() => {
      const box = (el) => { const r = el.getBoundingClientRect(); return { left: r.left, right: r.right, top: r.top, bottom: r.bottom, height: r.height }; };
      const $ = (id) => document.getElementById(id);
      const log = $('log');
      return { pageWidth: document.documentElement.scrollWidth, viewHeight: innerHeight, log: box(log), gap: log.scrollHeight - log.scrollTop - log.clientHeight,
               last: box(log.lastElementChild), input: box($('input')), send: box($('send')), stats: box($('stats')), footer: box(document.querySelector('footer')),
               header: box(document.querySelector('header')), statsLines: $('stats').getClientRects().length, statsFont: parseFloat(getComputedStyle($('stats')).lineHeight) };
    });
    const msg = JSON.stringify(g);
    assert.ok(g.pageWidth <= 375, `the page is ${g.pageWidth} px wide: ${msg}`);
    assert.ok(g.log.bottom - g.log.top > 200, `the conversation has ${g.log.bottom - g.log.top} px: ${msg}`);
    assert.ok(g.gap < 2 && g.last.bottom <= g.log.bottom + 1, `the end of the reply is out of view: ${msg}`);
    assert.ok(g.footer.bottom <= g.viewHeight + 1, `the footer runs off the screen: ${msg}`);
    const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
    assert.ok(!overlap(g.stats, g.input) && !overlap(g.stats, g.send) && !overlap(g.input, g.send), `footer items overlap: ${msg}`);
    assert.ok(g.stats.top >= g.footer.top && g.stats.bottom <= g.footer.bottom + 1 && g.stats.height <= g.statsFont + 1, `the stats are not one line in the footer: ${msg}`);
    assert.match((await shown(page)).stats, /300 generated|stop$/);
    // Scrolled up and back down by touch-sized steps: the end still shows.
    await page.$eval('#log', (l) => { l.scrollTop = 0; });
    await page.$eval('#log', (l) => { l.scrollTop = l.scrollHeight; });
    assert.ok(await page.$eval('#log', (l) => l.lastElementChild.getBoundingClientRect().bottom <= l.getBoundingClientRect().bottom + 1));
    // The system prompt opened above it shrinks the conversation's area: its end stays in view.
    await page.click('#sysbtn');
    await waitFor(page, () => { const l = document.getElementById('log'); return l.lastElementChild.getBoundingClientRect().bottom <= l.getBoundingClientRect().bottom + 1; });
    if (SHOTS) await page.screenshot({ path: path.join(SHOTS, 'webui-375-system.png') });
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
});

test('API key: asked for, a wrong one said so, the message typed before it kept, the key remembered', async () => {
  const locked = await startServer(['--api-key', 'k3']);
  const { page, problems, chats, close } = await openPage(locked, { allow401: true });
  try {
    await waitFor(page, () => document.getElementById('model').textContent === 'needs an API key');
    assert.equal(await page.$eval('#keylabel', (l) => l.hidden), false);
    assert.equal((await shown(page)).focus, 'key');
    await setField(page, 'max_tokens', '3');
    await sendMessage(page, 'Hello?');
    await waitFor(page, () => document.querySelector('#log .error') !== null);
    let now = await shown(page);
    assert.deepEqual(now.bubbles, [{ cls: 'msg error',
      text: 'This server needs an API key. Enter it in the API key box at the top, then send again. Your message is back in the box below.' }]);
    assert.equal(now.input, 'Hello?');
    assert.equal(now.focus, 'key');
    await page.keyboard.type('not-it');
    await page.keyboard.press('Enter');
    await waitFor(page, () => document.getElementById('model').textContent === 'API key not accepted');
    await setField(page, 'key', 'k3');
    await page.keyboard.press('Enter');
    await waitFor(page, () => /context/.test(document.getElementById('model').textContent));
    await waitFor(page, () => document.activeElement.id === 'input');  // back to the message that waits there
    await page.keyboard.press('Enter');
    await replyDone(page);
    now = await shown(page);
    assert.deepEqual(now.bubbles.map((b) => b.cls), ['msg error', 'msg user', 'msg assistant']);
    assert.equal(now.bubbles[1].text, 'Hello?');
    assert.deepEqual(chats.at(-1).messages, [{ role: 'user', content: 'Hello?' }]);
    await page.reload({ waitUntil: 'load' });
    await waitFor(page, () => /context/.test(document.getElementById('model').textContent));
    assert.equal(await page.$eval('#key', (k) => k.value), 'k3');
    assert.equal(await page.$eval('#keylabel', (l) => l.hidden), true);
    assert.deepEqual(problems, []);
  } finally {
    await close();
    await locked.stop();
  }
});
