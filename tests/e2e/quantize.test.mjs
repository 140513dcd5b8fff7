// `arbor quantize`: a small generated Llama checkpoint quantized at every bit width and group size, one mixed
// recipe, f32 and f16 inputs and several shards; every tensor's codes, scales and biases compared bit for bit
// with the independent numpy implementation of MLX's algorithm (tools/quant/mlx_affine_reference.py), plus
// config.json as mlx-lm writes it, the tokenizer files, and the errors.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync, execFileSync } from 'node:child_process';
import { ARBOR, SRC, deadline } from './lib.mjs';

deadline(300000);
const PYTHON = '/usr/bin/python3';
const REF = path.join(SRC, 'tools', 'quant', 'mlx_affine_reference.py');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-quantize-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));

// 4 layers, hidden 256, MLP 320 (a row of 320 divides into groups of 32 and 64, not 128), untied head.
const config = {
  _name_or_path: 'someone/tiny-llama', architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 384,
  hidden_size: 256, intermediate_size: 320, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2,
  head_dim: 64, max_position_embeddings: 512, rms_norm_eps: 1e-6, rope_theta: 10000.0, tie_word_embeddings: false,
  bos_token_id: 1, eos_token_id: 2, torch_dtype: 'bfloat16',
};
const tokFiles = {
  'tokenizer.json': '{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}\n',
  'tokenizer_config.json': '{"bos_token": "<s>", "eos_token": "</s>"}\n',
  'special_tokens_map.json': '{"eos_token": "</s>"}\n',
  'chat_template.jinja': '{% for m in messages %}{{ m.content }}{% endfor %}\n',
  'generation_config.json': '{"bos_token_id": 1, "eos_token_id": [2, 7]}\n',
};

function makeModel(name, cfg, dtype) {
  const d = path.join(dir, name);
  const cfgFile = path.join(dir, `${name}.json`);
  fs.writeFileSync(cfgFile, JSON.stringify(cfg));
  execFileSync(ARBOR, ['synth', '--config', cfgFile, '--out', d, '--dtype', dtype], { stdio: 'pipe' });
  for (const [f, text] of Object.entries(tokFiles)) fs.writeFileSync(path.join(d, f), text);
  return d;
}
const bf16 = makeModel('in-bf16', config, 'bf16');

function quantize(model, out, args) {
  return spawnSync(ARBOR, ['quantize', '--model', model, '--out', out, '--threads', '2', ...args], { encoding: 'utf8' });
}
function reference(model, out, bits, group, recipe) {
  const r = spawnSync(PYTHON, [REF, 'check', '--model', model, '--out', out, '--bits', String(bits), '--group-size',
    String(group), ...(recipe ? ['--recipe', recipe] : [])], { encoding: 'utf8' });
  assert.equal(r.status, 0, `reference check failed:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}
let runs = 0;
function quantizeAndCheck(model, bits, group, extra = [], recipe = null) {
  const out = path.join(dir, `out-${runs++}`);
  const r = quantize(model, out, ['--bits', String(bits), '--group-size', String(group), ...(recipe ? ['--recipe', recipe] : []), ...extra]);
  assert.equal(r.status, 0, r.stderr);
  const summary = reference(model, out, bits, group, recipe);
  return { out, stdout: r.stdout, summary };
}

test('every bit width and group size matches the numpy reference bit for bit', () => {
  const combos = [[2, 32], [3, 64], [4, 64], [5, 128], [6, 32], [8, 128], [4, 128], [3, 32]];
  for (const [bits, group] of combos) {
    const { out, stdout, summary } = quantizeAndCheck(bf16, bits, group);
    assert.match(summary, /tensors identical/);
    // The layout mlx-lm loads: uint32 codes [out, in*bits/32], bf16 scales and biases [out, in/group].
    const index = JSON.parse(fs.readFileSync(path.join(out, 'model.safetensors.index.json'), 'utf8'));
    assert.equal(index.weight_map['model.layers.0.self_attn.q_proj.weight'], 'model.safetensors');
    assert.ok(index.weight_map['model.embed_tokens.scales'] && index.weight_map['lm_head.biases']);
    assert.ok(!('model.norm.scales' in index.weight_map), 'norms stay dense');
    if (group === 128) {
      assert.match(stdout, /left dense: model\.layers\.0\.mlp\.down_proj\.weight: a row of 320 values does not divide into groups of 128/);
      assert.ok(index.weight_map['model.layers.0.mlp.down_proj.weight'] && !index.weight_map['model.layers.0.mlp.down_proj.scales']);
    } else {
      assert.ok(index.weight_map['model.layers.3.mlp.down_proj.scales']);
    }
  }
});

test('config.json and the tokenizer files as mlx-lm writes them', () => {
  const { out } = quantizeAndCheck(bf16, 4, 64);
  const text = fs.readFileSync(path.join(out, 'config.json'), 'utf8');
  const cfg = JSON.parse(text);
  assert.deepEqual(cfg.quantization, { group_size: 64, bits: 4, mode: 'affine' });
  assert.deepEqual(cfg.quantization_config, cfg.quantization);
  assert.ok(!('_name_or_path' in cfg));
  assert.deepEqual(cfg.eos_token_id, [2, 7], 'the generation config eos_token_id, as mlx-lm load_config merges it');
  assert.deepEqual(Object.keys(cfg), [...Object.keys(cfg)].sort(), 'keys sorted');
  assert.match(text, /^\{\n {4}"architectures"/, 'indent 4');
  for (const [f, body] of Object.entries(tokFiles)) assert.equal(fs.readFileSync(path.join(out, f), 'utf8'), body, f);
  const meta = JSON.parse(fs.readFileSync(path.join(out, 'model.safetensors.index.json'), 'utf8')).metadata;
  assert.ok(meta.total_size > 0 && meta.total_parameters > 0);
});

test('mixed recipes: per-module entries and the high bits where mlx-lm puts them', () => {
  const { out } = quantizeAndCheck(bf16, 4, 64, [], 'mixed_3_6');
  const q = JSON.parse(fs.readFileSync(path.join(out, 'config.json'), 'utf8')).quantization;
  // 4 layers: n/8 = 0, 7n/8 = 3: layers 2 ((2 - 0) % 3 == 2) and 3 get 6 bits for v_proj and down_proj.
  assert.deepEqual(q['lm_head'], { group_size: 64, bits: 6, mode: 'affine' });
  assert.equal(q['model.layers.2.self_attn.v_proj'].bits, 6);
  assert.equal(q['model.layers.3.mlp.down_proj'].bits, 6);
  assert.equal(q['model.layers.1.mlp.down_proj'].bits, 3);
  assert.equal(q['model.layers.3.self_attn.q_proj'].bits, 3);
  assert.equal(q['model.embed_tokens'].bits, 3);
  assert.equal(q.bits, 4);
  quantizeAndCheck(bf16, 4, 32, [], 'mixed_2_6');
});

test('f32 and f16 inputs are cast to torch_dtype first; shards with an index', () => {
  const f32 = makeModel('in-f32', config, 'f32');
  quantizeAndCheck(f32, 4, 64);
  const f16 = makeModel('in-f16', { ...config, torch_dtype: 'float16' }, 'f16');
  quantizeAndCheck(f16, 5, 64);
  const { out } = quantizeAndCheck(bf16, 8, 64, ['--shard-gb', '0.0005']);
  const files = fs.readdirSync(out).filter((f) => f.endsWith('.safetensors')).sort();
  assert.ok(files.length >= 3, files.join(' '));
  assert.equal(files[0], `model-00001-of-${String(files.length).padStart(5, '0')}.safetensors`);
});

test('errors name the problem', () => {
  const bad = (args, re) => {
    const r = spawnSync(ARBOR, ['quantize', ...args], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, r.stdout);
    assert.match(r.stderr, re);
  };
  const out = path.join(dir, 'never');
  bad(['--model', bf16, '--out', out, '--bits', '7'], /bits 7 is not supported \(MLX affine: 2, 3, 4, 5, 6 or 8\)/);
  bad(['--model', bf16, '--out', out, '--group-size', '48'], /group_size 48 is not supported \(MLX affine: 32, 64 or 128\)/);
  bad(['--model', bf16, '--out', out, '--recipe', 'mixed_9_9'], /unknown recipe 'mixed_9_9' \(mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6\)/);
  bad(['--model', bf16, '--out', bf16], /already exists and is not an empty directory/);
  bad(['--model', bf16], /usage: arbor quantize --model IN --out OUT/);
  assert.ok(!fs.existsSync(out));
  // A checkpoint that is already quantized is refused.
  const { out: q } = quantizeAndCheck(bf16, 4, 64);
  bad(['--model', q, '--out', path.join(dir, 'again')], /already holds a quantization block/);
});

// Every tensor's {dtype, shape} across a checkpoint's safetensors files.
function headers(d) {
  const out = {};
  for (const f of fs.readdirSync(d).filter((x) => x.endsWith('.safetensors'))) {
    const buf = fs.readFileSync(path.join(d, f));
    const n = Number(buf.readBigUInt64LE(0));
    const h = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
    for (const [k, v] of Object.entries(h)) if (k !== '__metadata__') out[k] = { dtype: v.dtype, shape: v.shape };
  }
  return out;
}

test('synth --bits --group-size writes the layout quantize writes', () => {
  for (const [bits, group] of [[4, 64], [3, 128]]) {
    const cfgFile = path.join(dir, 'synth-cfg.json');
    fs.writeFileSync(cfgFile, JSON.stringify(config));
    const syn = path.join(dir, `synth-${bits}-${group}`);
    const r = spawnSync(ARBOR, ['synth', '--config', cfgFile, '--out', syn, '--bits', String(bits), '--group-size', String(group)], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const { out } = quantizeAndCheck(bf16, bits, group);
    assert.deepEqual(headers(syn), headers(out));
    const cfg = JSON.parse(fs.readFileSync(path.join(syn, 'config.json'), 'utf8'));
    assert.deepEqual(cfg.quantization, { group_size: group, bits, mode: 'affine' });
    assert.deepEqual(cfg.quantization_config, cfg.quantization);
  }
  const r = spawnSync(ARBOR, ['synth', '--config', path.join(dir, 'synth-cfg.json'), '--out', path.join(dir, 'x'), '--bits', '7'], { encoding: 'utf8' });
  assert.match(r.stderr, /bits 7 is not supported/);
});
