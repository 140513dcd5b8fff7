// `--dummy-weights --bits B --group-size G` (issue 19 item 6): quantized dummy weights for the verbs that load a
// model, made in memory as `arbor synth --bits` writes them (so both give the same ids); bench and inspect report
// bits, weight bytes and weights (not packed words) as parameters; the flags' errors.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync, execFileSync } from 'node:child_process';
import { ARBOR, deadline } from './lib.mjs';

deadline(120000);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-dummy-affine-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));

// hidden 128, MLP 192: at group 128 the down projection (rows of 192) stays dense.
const config = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 256, hidden_size: 128, intermediate_size: 192,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 512, rms_norm_eps: 1e-5,
  tie_word_embeddings: false,
};
const cfgFile = path.join(dir, 'config.json');
fs.writeFileSync(cfgFile, JSON.stringify(config));

function arbor(args) {
  return spawnSync(ARBOR, args, { encoding: 'utf8' });
}
const prompt = ['--prompt-ids', '1,5,9,77,3,96,41,12', '--max-tokens', '6', '--threads', '2'];

test('generate with quantized dummy weights gives the ids of the synth checkpoint', () => {
  for (const [bits, group] of [[4, 64], [3, 32], [8, 128]]) {
    const d = path.join(dir, `synth-${bits}-${group}`);
    execFileSync(ARBOR, ['synth', '--config', cfgFile, '--out', d, '--bits', String(bits), '--group-size', String(group)], { stdio: 'pipe' });
    const dummy = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--bits', String(bits), '--group-size', String(group), ...prompt]);
    assert.equal(dummy.status, 0, dummy.stderr);
    const ckpt = arbor(['generate', '--model', d, ...prompt]);
    assert.equal(ckpt.status, 0, ckpt.stderr);
    const ids = dummy.stdout.trim().split('\n')[0];
    assert.match(ids, /^\d+(,\d+){5}$/);
    assert.equal(ids, ckpt.stdout.trim().split('\n')[0], `${bits}-bit g${group}`);
  }
});

test('bench reports the format, packed bytes and parameters as weights', () => {
  const bench = (extra) => {
    const r = arbor(['bench', '--config', cfgFile, '--dummy-weights', '--prompt-tokens', '8', '--decode-tokens', '2', '--reps', '1',
      '--threads', '2', ...extra]);
    assert.equal(r.status, 0, r.stderr);
    return r.stdout;
  };
  const q = bench(['--bits', '4', '--group-size', '128']), dense = bench([]);
  const params = (s) => s.match(/^matrices .*; (\d+) parameters$/m)?.[1];
  assert.match(q, /^matrices +affine 4-bit g128 x14, dense BF16 x2; \d+ parameters$/m);
  assert.match(q, /^weights .*\(BF16, U32\)/m);
  assert.match(dense, /^matrices +dense BF16 x16; \d+ parameters$/m);
  assert.equal(params(q), params(dense));
});

test('inspect sizes a config as the quantized dummy weights hold it', () => {
  const r = arbor(['inspect', '--config', cfgFile, '--bits', '3', '--group-size', '32']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^affine +embed_tokens: 3-bit g32 x1, 16384 bytes/m);  // codes 256 x 128 x 3/8, + 256 x 4 groups x (2 + 2)
  assert.match(r.stdout, /^affine +down_proj: 3-bit g32 x2,/m);
  const plain = arbor(['inspect', '--config', cfgFile]);
  assert.equal(r.stdout.match(/^parameters .*$/m)[0], plain.stdout.match(/^parameters .*$/m)[0]);
});

test('the flags fail clearly', () => {
  let r = arbor(['generate', '--config', cfgFile, '--bits', '4', ...prompt]);
  assert.notEqual(r.status, 0);
  r = arbor(['generate', '--model', path.join(dir, 'synth-4-64'), '--bits', '4', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--bits\/--group-size make quantized --dummy-weights/);
  r = arbor(['generate', '--config', cfgFile, '--dummy-weights', '--bits', '7', ...prompt]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /bits 7 is not supported/);
  r = arbor(['bench', '--config', cfgFile, '--dummy-weights', '--group-size', '48', '--prompt-tokens', '8']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /group_size 48 is not supported/);
});
