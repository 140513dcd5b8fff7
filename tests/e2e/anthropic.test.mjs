// Anthropic Messages (/v1/messages): response shape, the exact SSE event sequence, stop_sequences,
// tool_use/tool_result round trip, Anthropic error shape; and /metrics in Prometheus text format.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, deadline, post, parseSSE } from './lib.mjs';

deadline(60000);
const server = await startServer(['--ctx-size', '1024']);
const url = `${server.baseURL}/messages`;
const base = { model: 'claude-whatever', max_tokens: 6, temperature: 0, messages: [{ role: 'user', content: 'Hello' }] };
test.after(async () => { await server.stop(); });

test('non-stream message', async () => {
  const r = await post(url, { ...base, system: 'Be brief.' });
  assert.equal(r.status, 200, r.text);
  const m = r.body;
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'qwen3-tiny');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 6);
  assert.ok(m.usage.input_tokens > 5);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);
});

test('stream: exact event sequence, text equals non-stream', async () => {
  const ref = (await post(url, base)).body.content[0].text;
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...base, stream: true }) });
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const ev = parseSSE(await r.text());
  for (const e of ev) assert.equal(e.event, e.data.type);  // "event: X" matches data.type
  const names = ev.map((e) => e.event);
  assert.equal(names[0], 'message_start');
  assert.equal(names[1], 'content_block_start');
  assert.equal(names.at(-3), 'content_block_stop');
  assert.equal(names.at(-2), 'message_delta');
  assert.equal(names.at(-1), 'message_stop');
  assert.ok(names.slice(2, -3).every((n) => n === 'content_block_delta'), names.join(','));
  assert.equal(ev[0].data.message.content.length, 0);
  assert.equal(ev[0].data.message.stop_reason, null);
  assert.deepEqual(ev[1].data.content_block, { type: 'text', text: '' });
  assert.equal(ev[1].data.index, 0);
  const text = ev.filter((e) => e.event === 'content_block_delta').map((e) => { assert.equal(e.data.delta.type, 'text_delta'); return e.data.delta.text; }).join('');
  assert.equal(text, ref);
  assert.equal(ev.at(-2).data.delta.stop_reason, 'max_tokens');
  assert.equal(ev.at(-2).data.usage.output_tokens, 6);
});

test('stop_sequences', async () => {
  const full = (await post(url, { ...base, max_tokens: 10 })).body.content[0].text;
  const chars = [...full];
  const stop = chars.slice(2, 4).join('');
  const r = (await post(url, { ...base, max_tokens: 10, stop_sequences: [stop] })).body;
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  assert.equal(r.content[0]?.text ?? '', full.slice(0, full.indexOf(stop)));
});

test('tool_use / tool_result round trip and thinking switch', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const first = await post(url, { ...base, tools });
  assert.equal(first.status, 200, first.text);
  const convo = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'text', text: 'Checking.' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }] },
  ];
  const second = await post(url, { ...base, tools, messages: convo });
  assert.equal(second.status, 200, second.text);
  // The whole prompt is input_tokens + cache_read_input_tokens (the prefix cache serves shared blocks).
  const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
  assert.ok(prompt(second.body.usage) > prompt(first.body.usage) + 20);
  const off = await post(url, { ...base, thinking: { type: 'disabled' } });
  const on = await post(url, { ...base, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.ok(prompt(off.body.usage) > prompt(on.body.usage));  // the empty <think></think> block
});

test('Anthropic error shape', async () => {
  const r = await post(url, { messages: base.messages });
  assert.equal(r.status, 400);
  assert.equal(r.body.type, 'error');
  assert.equal(r.body.error.type, 'invalid_request_error');
  assert.match(r.body.error.message, /max_tokens/);
  const bad = await post(url, { ...base, messages: [{ role: 'system', content: 'x' }] });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /messages\[0\]\.role/);
});

test('/metrics is Prometheus text', async () => {
  const r = await fetch(`${server.url}/metrics`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const t = await r.text();
  for (const name of ['arbor_requests_running', 'arbor_requests_waiting', 'arbor_kv_blocks_used', 'arbor_generation_tokens_total',
    'arbor_prompt_tokens_total', 'arbor_prefix_cache_hit_tokens_total'])
    assert.match(t, new RegExp(`^# TYPE ${name} (gauge|counter)$`, 'm'));
  assert.match(t, /^arbor_http_requests_total\{route="\/v1\/messages",status="200"\} \d+$/m);
  assert.match(t, /^arbor_http_requests_total\{route="\/v1\/messages",status="400"\} 2$/m);
  for (const line of t.split('\n')) if (line && !line.startsWith('#')) assert.match(line, /^[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+$/, line);
});
