// --kv-cache through the binary on the default model (6 layers, 2 KV heads, head_dim 64, CPU): serve
// sizes its KV pool by the codec's bytes per token within --kv-memory-gb and reports them in /metrics,
// a coded cache answers requests, and bad specs are clear errors.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import { startServer, deadline, metrics, post, ARBOR, SRC } from './lib.mjs';

deadline(120000);
const model = path.join(SRC, 'models', 'arbor-tiny-sotu');
const budget = 0.01;  // GB
// Bytes per token, every layer's K and V: plain f32 on the CPU 6*2*2*64*4; k8v3 per head K 64 + 2*(2+2),
// V 64*3/8 + 2*2.
const plainBytes = 6 * 2 * 2 * 64 * 4, k8v3Bytes = 6 * 2 * (72 + 28);

const servers = {
  bf16: await startServer(['--model', model, '--kv-memory-gb', String(budget), '--max-batch', '64'], { model: null }),
  k8v3: await startServer(['--model', model, '--kv-memory-gb', String(budget), '--max-batch', '64', '--kv-cache', 'k8v3,0:bf16'],
    { model: null }),
};
test.after(async () => {
  for (const s of Object.values(servers)) { const e = await s.stop(); assert.equal(e.code, 0, `server exit ${JSON.stringify(e)}`); }
});

test('serve fits the pool to the codec and reports it', async () => {
  const mb = await metrics(servers.bf16.url), mk = await metrics(servers.k8v3.url);
  assert.equal(mb.arbor_kv_bytes_per_token, plainBytes);
  const mixed = plainBytes / 6 + 5 * k8v3Bytes / 6;  // layer 0 plain, layers 1-5 k8v3
  assert.equal(mk.arbor_kv_bytes_per_token, mixed);
  assert.equal(mb.arbor_kv_capacity_tokens, Math.floor(budget * 1e9 / (plainBytes * 16)) * 16);
  assert.equal(mk.arbor_kv_capacity_tokens, Math.floor(budget * 1e9 / (mixed * 16)) * 16);
  assert.ok(mk.arbor_kv_capacity_tokens > 3 * mb.arbor_kv_capacity_tokens);  // f32 plain vs mostly k8v3: 3.05x
});

test('a coded cache answers a completion', async () => {
  const r = await post(`${servers.k8v3.baseURL}/completions`, { prompt: 'The state of our Union is', max_tokens: 8, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.body.usage.completion_tokens > 0 && r.body.usage.completion_tokens <= 8, r.text);
});

test('bad --kv-cache specs are clear errors', () => {
  const run = (args) => spawnSync(ARBOR, args, { encoding: 'utf8' });
  let r = run(['generate', '--model', model, '--prompt', 'x', '--max-tokens', '1', '--kv-cache', 'k8v9']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /kv codec 'k8v9': TurboQuant values take 2 to 4 bits/);
  r = run(['generate', '--model', model, '--prompt', 'x', '--max-tokens', '1', '--kv-cache', 'k8v3,7:bf16']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /layer 7 in '7:bf16' is outside the model's 6 layers/);
  // head_dim 16: TurboQuant cannot code it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-kv-'));
  const cfg = path.join(dir, 'config.json');
  fs.writeFileSync(cfg, JSON.stringify({ model_type: 'llama', vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
    num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, max_position_embeddings: 128, rms_norm_eps: 1e-6 }));
  r = run(['generate', '--config', cfg, '--dummy-weights', '--prompt-ids', '1,2,3', '--max-tokens', '1', '--kv-cache', 'k8v3']);
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /TurboQuant needs head_dim 64, 128, 256 or 512 \(the model's is 16\)/);
  r = run(['generate', '--model', model, '--prompt', 'The Union', '--max-tokens', '4', '--kv-cache', 'affine4', '--temperature', '0']);
  assert.equal(r.status, 0, r.stderr);
});
