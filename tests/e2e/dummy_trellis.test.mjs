// `--dummy-weights --format trellis --bits K` (issue 20): trellis-coded dummy weights for the verbs that load a
// model, made in memory as `arbor synth --format trellis` writes them (so both give the same ids); bench reports
// the trellis matrices and weights (not packed words) as parameters; the flags' errors.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync, execFileSync } from 'node:child_process';
import { ARBOR, deadline } from './lib.mjs';

deadline(120000);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-dummy-trellis-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));

// hidden 256, MLP 512: every layer linear codes (axis 1 along 256/512 inputs, the down projection on axis 0
// along its 256 outputs); embedding and head stay dense.
const config = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 256, hidden_size: 256, intermediate_size: 512,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 512, rms_norm_eps: 1e-5,
  tie_word_embeddings: false,
};
const cfgFile = path.join(dir, 'config.json');
fs.writeFileSync(cfgFile, JSON.stringify(config));

function arbor(args) {
  return spawnSync(ARBOR, args, { encoding: 'utf8' });
}
const prompt = ['--prompt-ids', '1,5,9,77,3,96,41,12', '--max-tokens', '6', '--threads', '2'];

test('generate with trellis dummy weights gives the ids of the synth checkpoint', () => {
  for (const [bits, axis] of [[2, 0], [3, 0], [4, 0], [3, 1]]) {
    const d = path.join(dir, `synth-${bits}-${axis}`);
    const flags = ['--format', 'trellis', '--bits', String(bits), '--down-axis', String(axis)];
    execFileSync(ARBOR, ['synth', '--config', cfgFile, '--out', d, ...flags], { stdio: 'pipe' });
    const dummy = arbor(['generate', '--config', cfgFile, '--dummy-weights', ...flags, ...prompt]);
    assert.equal(dummy.status, 0, dummy.stderr);
    const ckpt = arbor(['generate', '--model', d, ...prompt]);
    assert.equal(ckpt.status, 0, ckpt.stderr);
    const ids = dummy.stdout.trim().split('\n')[0];
    assert.match(ids, /^\d+(,\d+){5}$/);
    assert.equal(ids, ckpt.stdout.trim().split('\n')[0], `k=${bits} down axis ${axis}`);
  }
});

test('bench reports the trellis matrices, packed bytes and parameters as weights', () => {
  const bench = (extra) => {
    const r = arbor(['bench', '--config', cfgFile, '--dummy-weights', '--prompt-tokens', '8', '--decode-tokens', '2', '--reps', '1',
      '--threads', '2', ...extra]);
    assert.equal(r.status, 0, r.stderr);
    return r.stdout;
  };
  const t = bench(['--format', 'trellis', '--bits', '2']), dense = bench([]);
  const params = (s) => s.match(/^matrices .*; (\d+) parameters$/m)?.[1];
  assert.match(t, /^matrices +trellis 2-bit axis 1 x12, dense BF16 x2, trellis 2-bit axis 0 x2; \d+ parameters$/m);
  assert.match(t, /^weights .*\(BF16, F16, U32\)/m);
  assert.equal(params(t), params(dense));
});

test('the flags fail clearly', () => {
  let r = arbor(['generate', '--model', path.join(dir, 'synth-2-0'), '--format', 'trellis', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /make quantized --dummy-weights/);
  r = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--format', 'trellis', '--bits', '5', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /trellis bits 5 \(supported: 2, 3, 4\)/);
  r = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--format', 'trellis', '--group-size', '64', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--group-size is for affine weights/);
  r = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--down-axis', '1', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--down-axis is for --format trellis/);
  r = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--format', 'gguf', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--format must be dense, affine or trellis/);
});
