// `arbor quantize --format trellis`: a small generated Llama checkpoint trellis-coded (k = 3, the down
// projection k = 4 by --k-map, on axis 0 and on axis 1), every coded tensor decoded here by an independent
// reading of formats.md §3 (the bit window, the 1MAD code, the row scale, axis 0 transposed) and compared
// with the source weights (relative MSE within the encoder's distortion for k); the config entries, the
// encoder's weights-per-second report, `arbor inspect`, `synth --format trellis` writing the same layout,
// the checkpoint running (`arbor bench`), and the errors; `--calib` (LDLQ) with `--axis 0` and `--rotate` on a
// tied model with the evaluation model's tokenizer: the reports, the layout, no rotated copy left, and it runs;
// `--calib-layers 1` (a calibration pass a layer) writing the same checkpoint as one pass.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync, execFileSync } from 'node:child_process';
import { ARBOR, SRC, deadline } from './lib.mjs';

deadline(300000);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-quantize-trellis-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));

// 2 layers, hidden 256, MLP 512 (the down projection codes 256 outputs on axis 0, 512 inputs on axis 1).
const config = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 384, hidden_size: 256, intermediate_size: 512,
  num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 512,
  rms_norm_eps: 1e-6, rope_theta: 10000.0, tie_word_embeddings: false, torch_dtype: 'bfloat16',
};
const cfgFile = path.join(dir, 'config.json');
fs.writeFileSync(cfgFile, JSON.stringify(config));
const src = path.join(dir, 'in');
execFileSync(ARBOR, ['synth', '--config', cfgFile, '--out', src, '--dtype', 'bf16'], { stdio: 'pipe' });

// name -> {dtype, shape, data: Buffer} over a checkpoint's safetensors files.
function tensors(d) {
  const out = {};
  for (const f of fs.readdirSync(d).filter((x) => x.endsWith('.safetensors'))) {
    const buf = fs.readFileSync(path.join(d, f));
    const n = Number(buf.readBigUInt64LE(0));
    const h = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
    for (const [k, v] of Object.entries(h)) {
      if (k === '__metadata__') continue;
      out[k] = { dtype: v.dtype, shape: v.shape, data: buf.subarray(8 + n + v.data_offsets[0], 8 + n + v.data_offsets[1]) };
    }
  }
  return out;
}

const bf16 = (buf, i) => { const b = Buffer.alloc(4); b.writeUInt16LE(buf.readUInt16LE(2 * i), 2); return b.readFloatLE(0); };
function f16(h) {
  const s = h >> 15 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
  if (e === 0) return s * m * 2 ** -24;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

// formats.md §3, read independently: weight t of a 256-weight block is the 12-bit window at bit (255 - t)*k
// (wrapping to the block's start), state -> byte sum of (state*34038481 + 76625530) mod 2^32, minus 510,
// over 147.800537109375, times the row's f16 scale. Returns W [out, in] (axis 0: stored [in, out]).
function decode(words, scales, k, axis, out, inDim) {
  const rows = axis === 1 ? out : inDim, cols = axis === 1 ? inDim : out, wpb = 256 * k / 32, wpr = cols / 256 * wpb;
  const W = new Float64Array(out * inDim);
  for (let r = 0; r < rows; ++r) {
    const scale = f16(scales.readUInt16LE(2 * r));
    for (let b = 0; b < cols / 256; ++b) {
      const base = r * wpr + b * wpb;
      const bit = (i) => (words.readUInt32LE(4 * (base + ((i >> 5) % wpb))) >>> (i & 31)) & 1;
      for (let t = 0; t < 256; ++t) {
        let state = 0;
        for (let j = 0; j < 12; ++j) state |= bit(((255 - t) * k + j) % (256 * k)) << j;
        const x = (Math.imul(state, 34038481) + 76625530) >>> 0;
        const y = (x & 255) + ((x >>> 8) & 255) + ((x >>> 16) & 255) + (x >>> 24) - 510;
        const v = (y / 147.800537109375) * scale;
        const c = b * 256 + t;
        if (axis === 1) W[r * inDim + c] = v; else W[c * inDim + r] = v;
      }
    }
  }
  return W;
}

test('quantize --format trellis: every coded tensor decodes close to its source, entries and report', () => {
  const out = path.join(dir, 'q');
  const r = spawnSync(ARBOR, ['quantize', '--model', src, '--out', out, '--format', 'trellis', '--bits', '3', '--k-map', 'down_proj=4',
    '--threads', '2'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /14 modules trellis-coded \(k=3, down axis 0, k-map down_proj=4\)/);
  assert.match(r.stdout, /encoder: 1179648 weights in [0-9.]+ s, [0-9.e+]+ weights\/s/);
  const cfg = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8'));
  const q = cfg.quantization;
  assert.deepEqual(cfg.quantization_config, q);
  assert.equal(q.mode, 'trellis');
  assert.deepEqual(q['model.layers.1.mlp.down_proj'], { mode: 'trellis', bits: 4, group_size: 256, trellis: { L: 12, code: '1mad', axis: 0 } });
  assert.deepEqual(q['model.layers.0.self_attn.q_proj'], { mode: 'trellis', bits: 3, group_size: 256, trellis: { L: 12, code: '1mad', axis: 1 } });
  assert.ok(!('model.embed_tokens' in q) && !('lm_head' in q));
  const tin = tensors(src), tq = tensors(out);
  assert.ok(!('model.embed_tokens.scales' in tq) && tq['lm_head.weight'].dtype === 'BF16', 'embedding and head dense');
  for (const [name, t] of Object.entries(tin)) {
    const m = name.slice(0, -'.weight'.length);
    if (!(m in q)) continue;
    const { bits: k, trellis: { axis } } = q[m];
    const [o, i] = t.shape;
    assert.deepEqual(tq[`${m}.weight`].shape, axis === 1 ? [o, i * k / 32] : [i, o * k / 32], m);
    assert.equal(tq[`${m}.weight`].dtype, 'U32');
    assert.deepEqual(tq[`${m}.scales`], { ...tq[`${m}.scales`], dtype: 'F16', shape: [axis === 1 ? o : i] });
    const W = decode(tq[`${m}.weight`].data, tq[`${m}.scales`].data, k, axis, o, i);
    let err = 0, ref = 0;
    for (let j = 0; j < o * i; ++j) { const s = bf16(t.data, j); err += (W[j] - s) ** 2; ref += s * s; }
    assert.ok(err / ref < (k === 3 ? 0.04 : 0.012), `${m}: relative MSE ${err / ref} at k=${k}`);
    assert.ok(err / ref > 1e-4, `${m}: suspiciously exact (${err / ref})`);
  }
});

test('down projection on axis 1; synth --format trellis writes the same layout; inspect and bench run it', () => {
  const out = path.join(dir, 'q1');
  const r = spawnSync(ARBOR, ['quantize', '--model', src, '--out', out, '--format', 'trellis', '--bits', '2', '--down-axis', '1'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const q = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8')).quantization;
  assert.equal(q['model.layers.0.mlp.down_proj'].trellis.axis, 1);
  const syn = path.join(dir, 'syn');
  const s = spawnSync(ARBOR, ['synth', '--config', cfgFile, '--out', syn, '--format', 'trellis', '--bits', '2', '--down-axis', '1'], { encoding: 'utf8' });
  assert.equal(s.status, 0, s.stderr);
  const shapes = (d) => Object.fromEntries(Object.entries(tensors(d)).map(([k, v]) => [k, [v.dtype, v.shape]]));
  assert.deepEqual(shapes(syn), shapes(out));
  const ins = spawnSync(ARBOR, ['inspect', out], { encoding: 'utf8' });
  assert.equal(ins.status, 0, ins.stderr);
  assert.match(ins.stdout, /trellis +down_proj: 2-bit axis 1 x2, \d+ bytes/);
  assert.match(ins.stdout, /trellis +q_proj: 2-bit axis 1 x2, 33792 bytes/);  // 2 x (256 x 16 words x 4 + 256 x 2)
  for (const d of [out, syn]) {
    const b = spawnSync(ARBOR, ['bench', '--model', d, '--threads', '2', '--prompt-tokens', '16', '--chunk', '16', '--decode-tokens', '4', '--reps', '1'],
      { encoding: 'utf8' });
    assert.equal(b.status, 0, b.stderr);
    assert.match(b.stdout, /tok\/s/);
  }
});

test('--calib with --axis 0 and --rotate: LDLQ on a rotated, untied checkpoint that runs', () => {
  const eval_model = path.join(SRC, 'tests/fixtures/eval-model');
  const cfg2 = { ...config, vocab_size: 4096, tie_word_embeddings: true };
  const cfgFile2 = path.join(dir, 'config_tied.json');
  fs.writeFileSync(cfgFile2, JSON.stringify(cfg2));
  const src2 = path.join(dir, 'in_tied');
  execFileSync(ARBOR, ['synth', '--config', cfgFile2, '--out', src2, '--dtype', 'bf16'], { stdio: 'pipe' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(eval_model, f), path.join(src2, f));
  const out = path.join(dir, 'q_ldlq');
  const r = spawnSync(ARBOR, ['quantize', '--model', src2, '--out', out, '--format', 'trellis', '--bits', '2', '--axis', '0', '--rotate',
    '--calib', path.join(eval_model, 'heldout.txt'), '--calib-tokens', '2048', '--calib-ctx', '256', '--threads', '2'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /rotated the residual stream \(random Hadamard, seed 0\): \d+ tensors; the tied embedding untied/);
  // k/v project to 128 outputs: too few to code along (axis 0 codes blocks of 256 outputs), so they stay dense.
  assert.match(r.stdout, /10 modules trellis-coded \(k=2, down axis 0, the others axis 0\)/);
  assert.match(r.stdout, /left dense: model.layers.1.self_attn.v_proj.weight: axis 0: coded length 128 is not a multiple of 256/);
  assert.match(r.stdout, /LDLQ: 10 modules against their input Hessians \(2048 calibration ids, windows of 256, 1 pass\(es\), [0-9.]+ s; damp 0.01\)/);
  assert.ok(!fs.existsSync(`${out}.rotating`), 'the rotated copy is removed');
  const cfg = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8'));
  assert.equal(cfg.tie_word_embeddings, false);
  assert.equal(cfg.quantization['model.layers.0.self_attn.q_proj'].trellis.axis, 0);
  const tq = tensors(out);
  assert.equal(tq['lm_head.weight'].dtype, 'BF16');
  assert.deepEqual(tq['model.layers.1.mlp.gate_proj.weight'].shape, [256, 512 * 2 / 32]);  // stored [in, out*k/32]
  const b = spawnSync(ARBOR, ['bench', '--model', out, '--threads', '2', '--prompt-tokens', '16', '--chunk', '16', '--decode-tokens', '4', '--reps', '1'],
    { encoding: 'utf8' });
  assert.equal(b.status, 0, b.stderr);
  assert.match(b.stdout, /tok\/s/);
});

test('--calib-layers 1: a pass a layer writes the same checkpoint as one pass over all layers', () => {
  const eval_model = path.join(SRC, 'tests/fixtures/eval-model');
  const cfgFile3 = path.join(dir, 'config_tok.json');
  fs.writeFileSync(cfgFile3, JSON.stringify({ ...config, vocab_size: 4096 }));
  const src3 = path.join(dir, 'in_tok');
  execFileSync(ARBOR, ['synth', '--config', cfgFile3, '--out', src3, '--dtype', 'bf16'], { stdio: 'pipe' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(eval_model, f), path.join(src3, f));
  const run = (out, extra) => {
    const r = spawnSync(ARBOR, ['quantize', '--model', src3, '--out', out, '--format', 'trellis', '--bits', '2', '--encoder', 'cpu',
      '--calib', path.join(eval_model, 'heldout.txt'), '--calib-tokens', '1024', '--calib-ctx', '128', '--threads', '2', ...extra],
      { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    return r.stdout;
  };
  const one = run(path.join(dir, 'q_calib_all'), []);
  assert.match(one, /calibration: the input Hessians take [0-9.]+ GB a layer, [0-9.]+ GB for 2 layer\(s\) a pass; 1 pass\(es\)/);
  assert.match(one, /LDLQ: 14 modules against their input Hessians \(1024 calibration ids, windows of 128, 1 pass\(es\)/);
  const two = run(path.join(dir, 'q_calib_layers'), ['--calib-layers', '1']);
  assert.match(two, /for 1 layer\(s\) a pass; 2 pass\(es\)/);
  assert.match(two, /LDLQ: 14 modules against their input Hessians \(1024 calibration ids, windows of 128, 2 pass\(es\)/);
  const a = tensors(path.join(dir, 'q_calib_all')), b = tensors(path.join(dir, 'q_calib_layers'));
  assert.deepEqual(Object.keys(b).sort(), Object.keys(a).sort());
  for (const k of Object.keys(a)) assert.ok(a[k].data.equals(b[k].data), k);
});

test('errors name the problem', () => {
  const bad = (args, re) => {
    const r = spawnSync(ARBOR, ['quantize', '--model', src, '--out', path.join(dir, 'never'), '--format', 'trellis', ...args], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, r.stdout);
    assert.match(r.stderr, re);
  };
  bad(['--bits', '5'], /trellis bits 5 \(supported: 2, 3, 4\)/);
  bad(['--group-size', '64'], /--group-size is for --format affine/);
  bad(['--k-map', 'down_proj=7'], /--k-map: 'down_proj=7': k must be 2, 3 or 4/);
  bad(['--down-axis', '2'], /down axis 2 \(0 or 1\)/);
  bad(['--axis', '2'], /axis 2 \(0 or 1\)/);
  bad(['--damp', '0.1'], /--damp goes with --calib TEXT/);
  bad(['--calib-layers', '1'], /--calib-layers goes with --calib TEXT/);
  bad(['--calib', path.join(dir, 'no-such-file.txt')], /no-such-file\.txt/);
  const r = spawnSync(ARBOR, ['quantize', '--model', src, '--out', path.join(dir, 'never'), '--k-map', 'down_proj=4'], { encoding: 'utf8' });
  assert.match(r.stderr, /--k-map is for --format trellis/);
  const c = spawnSync(ARBOR, ['quantize', '--model', src, '--out', path.join(dir, 'never'), '--calib', 'x.txt'], { encoding: 'utf8' });
  assert.match(c.stderr, /--calib is for --format trellis/);
  assert.ok(!fs.existsSync(path.join(dir, 'never')));
});
