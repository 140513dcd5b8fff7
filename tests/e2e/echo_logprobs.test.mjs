// /v1/completions with echo + logprobs scores the prompt (what lm-evaluation-harness sends for a
// loglikelihood): each prompt token after the first gets its logprob given the ones before it, with
// alternatives. Reference: `arbor generate --logits-out` on the same model and ids (whose logits are
// checked against transformers elsewhere), log-softmaxed here in double precision. The prompt spans
// several prefill chunks (--max-step-tokens 16), and the prefix cache must neither feed nor spoil it.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { ARBOR, startServer, deadline, testModel, post } from './lib.mjs';

deadline(120000);
const ids = Array.from({ length: 41 }, (_, i) => (i * 7919 + 13) % 150000);

// log_softmax rows of `arbor generate --logits-out` for the prompt: row i scores ids[i + 1].
function reference() {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-echo-')), 'logits.f32');
  const r = spawnSync(ARBOR, ['generate', '--model', testModel(), '--threads', '1', '--prompt-ids', ids.join(','), '--max-tokens', '1',
    '--logits-out', file], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const buf = fs.readFileSync(file);
  const all = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
  const V = all.length / ids.length;
  const rows = [];
  for (let i = 0; i + 1 < ids.length; i++) {
    const row = all.subarray(i * V, (i + 1) * V);
    let max = -Infinity, arg = 0;
    for (let v = 0; v < V; v++) if (row[v] > max) { max = row[v]; arg = v; }
    let sum = 0;
    for (let v = 0; v < V; v++) sum += Math.exp(row[v] - max);
    const lse = max + Math.log(sum);
    rows.push({ logprob: row[ids[i + 1]] - lse, top: arg, topLogprob: max - lse });
  }
  return rows;
}

test('echo + logprobs: prompt scores match the reference, across chunks, twice', async () => {
  const ref = reference();
  const s = await startServer(['--max-step-tokens', '16']);
  try {
    const body = { prompt: ids, max_tokens: 1, temperature: 0, logprobs: 1, echo: true, return_tokens_as_token_ids: true };
    for (let round = 0; round < 2; round++) {
      const r = await post(`${s.baseURL}/completions`, body);
      assert.equal(r.status, 200, r.text);
      const lp = r.body.choices[0].logprobs;
      assert.equal(lp.tokens.length, ids.length + 1);  // the prompt, then the generated token
      assert.deepEqual(lp.tokens.slice(0, ids.length), ids.map((id) => `token_id:${id}`));
      assert.equal(lp.token_logprobs[0], null);
      assert.equal(lp.top_logprobs[0], null);
      for (let i = 1; i < ids.length; i++) {
        const want = ref[i - 1];
        assert.ok(Math.abs(lp.token_logprobs[i] - want.logprob) <= 1e-3 * Math.max(1, Math.abs(want.logprob)),
          `round ${round} token ${i}: ${lp.token_logprobs[i]} vs ${want.logprob}`);
        const [[alt, altLp]] = Object.entries(lp.top_logprobs[i]);
        assert.equal(alt, `token_id:${want.top}`, `round ${round} token ${i}: top alternative`);
        assert.ok(Math.abs(altLp - want.topLogprob) <= 1e-3 * Math.max(1, Math.abs(want.topLogprob)));
      }
      assert.ok(lp.text_offset.every((o, i) => i === 0 || o >= lp.text_offset[i - 1]));
      assert.equal(r.body.usage.prompt_tokens_details.cached_tokens, 0);  // scoring never reads the cache
    }
    // Its KV still serves later requests through the prefix cache, and they still answer the same.
    const plain = await post(`${s.baseURL}/completions`, { prompt: ids, max_tokens: 1, temperature: 0 });
    assert.ok(plain.body.usage.prompt_tokens_details.cached_tokens > 0);
  } finally {
    await s.stop();
  }
});

test('echo + logprobs with n > 1 scores the prompt once for every choice; streaming is refused', async () => {
  const s = await startServer();
  try {
    const r = await post(`${s.baseURL}/completions`, { prompt: ids.slice(0, 12), max_tokens: 3, n: 2, temperature: 1, seed: 5, logprobs: 0, echo: true });
    assert.equal(r.status, 200, r.text);
    const [a, b] = r.body.choices.map((c) => c.logprobs);
    assert.deepEqual(a.token_logprobs.slice(0, 12), b.token_logprobs.slice(0, 12));
    assert.equal(a.tokens.length, 12 + 3);
    const st = await post(`${s.baseURL}/completions`, { prompt: 'hi', max_tokens: 1, logprobs: 1, echo: true, stream: true });
    assert.equal(st.status, 400);
    assert.equal(st.body.error.param, 'echo');
  } finally {
    await s.stop();
  }
});

test('several prompts in one request: choices prompt-major, each as its own request answers', async () => {
  const s = await startServer();
  try {
    const prompts = ['The state of the union is', ids.slice(0, 9), [5, 6, 7]];
    const single = [];
    for (const prompt of prompts) {
      const r = await post(`${s.baseURL}/completions`, { prompt, max_tokens: 3, temperature: 0, logprobs: 2, echo: true });
      assert.equal(r.status, 200, r.text);
      single.push(r.body);
    }
    const r = await post(`${s.baseURL}/completions`, { prompt: prompts, n: 2, max_tokens: 3, temperature: 0, logprobs: 2, echo: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.choices.length, 6);
    r.body.choices.forEach((c, i) => {
      const want = single[Math.floor(i / 2)].choices[0];
      assert.equal(c.index, i);
      assert.equal(c.text, want.text, `choice ${i}`);
      assert.deepEqual(c.logprobs.tokens, want.logprobs.tokens, `choice ${i}`);
      assert.deepEqual(c.logprobs.text_offset, want.logprobs.text_offset, `choice ${i}`);
      c.logprobs.token_logprobs.forEach((lp, t) => {
        const w = want.logprobs.token_logprobs[t];
        assert.ok(lp === w || Math.abs(lp - w) <= 1e-4, `choice ${i} token ${t}: ${lp} vs ${w}`);
      });
    });
    assert.equal(r.body.usage.prompt_tokens, single.reduce((n, b) => n + b.usage.prompt_tokens, 0));
    assert.ok(r.body.choices[0].text.startsWith('The state of the union is'), r.body.choices[0].text);  // a text prompt echoes as given
    assert.ok(r.body.choices[0].text.length > 'The state of the union is'.length);
    const bad = await post(`${s.baseURL}/completions`, { prompt: ['fine', 5], max_tokens: 1 });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, 'prompt[1]');
  } finally {
    await s.stop();
  }
});
