// Step 2: byte-level BPE trained with npm `tokenizers` on the training split,
// written as models/arbor-tiny-sotu/tokenizer.json + tokenizer_config.json
// (with --preset eval: tests/fixtures/eval-model/, no chat template).
//
//   node tools/default_model/train_tokenizer.js [--preset eval]
//
// The Node binding trains only with the model's default BpeTrainer (vocab cap
// 30000, no special tokens, alphabet = bytes seen). BPE training is greedy and
// sequential, so the first k merges of that run are exactly what a run capped
// at the smaller size would produce; we keep the prefix that fills VOCAB_SIZE
// after the special tokens and the full 256-symbol byte alphabet, and lay the
// ids out as the HF trainer does with special_tokens + initial_alphabet.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const tk = require('tokenizers');
const C = require('./common');

function trainFullMerges(trainFile) {
  const t = new tk.Tokenizer(tk.BPE.empty());
  t.setPreTokenizer(tk.byteLevelPreTokenizer(false, true));
  t.train([trainFile]);
  const tmp = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-bpe-')), 'full.json');
  t.save(tmp, false);
  const full = JSON.parse(fs.readFileSync(tmp, 'utf8'));
  fs.rmSync(path.dirname(tmp), { recursive: true });
  return full.model.merges.map((m) => (Array.isArray(m) ? m : m.split(' ')));
}

function buildVocab(merges) {
  const vocab = {};
  let next = 0;
  const add = (tok) => {
    if (!(tok in vocab)) vocab[tok] = next++;
  };
  C.SPECIAL_TOKENS.forEach(add);
  // byteLevelAlphabet() is unordered; sort by code point (the HF trainer sorts its alphabet).
  [...tk.byteLevelAlphabet()].sort((a, b) => a.codePointAt(0) - b.codePointAt(0)).forEach(add);
  const kept = [];
  for (const [a, b] of merges) {
    if (next >= C.VOCAB_SIZE) break;
    if (!(a in vocab) || !(b in vocab)) throw new Error(`train_tokenizer: merge ${a} ${b} uses an unknown symbol`);
    kept.push([a, b]);
    add(a + b);  // two merges can yield one string: it keeps its first id
  }
  if (next !== C.VOCAB_SIZE) throw new Error(`train_tokenizer: only ${next} tokens, wanted ${C.VOCAB_SIZE}`);
  return { vocab, merges: kept };
}

function tokenizerJson(vocab, merges) {
  const ids = Object.fromEntries(C.SPECIAL_TOKENS.map((t) => [t, vocab[t]]));
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: C.SPECIAL_TOKENS.map((t) => ({
      id: ids[t], content: t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    // Llama 3 style: encode(text) with special tokens gives <|bos|> text.
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: C.BOS, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: C.BOS, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: C.BOS, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { [C.BOS]: { id: C.BOS, ids: [ids[C.BOS]], tokens: [C.BOS] } },
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
    },
  };
}

function tokenizerConfig(vocab) {
  const decoder = {};
  for (const t of C.SPECIAL_TOKENS) {
    decoder[String(vocab[t])] = { content: t, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
  }
  const cfg = {
    added_tokens_decoder: decoder,
    bos_token: C.BOS,
    eos_token: C.EOS,
    pad_token: C.PAD,
    unk_token: null,
    additional_special_tokens: C.SPECIAL_TOKENS.filter((t) => ![C.BOS, C.EOS, C.PAD].includes(t)),
    chat_template: C.CHAT ? C.CHAT_TEMPLATE : undefined,  // undefined: JSON.stringify leaves it out
    clean_up_tokenization_spaces: false,
    model_max_length: C.CONTEXT,
    tokenizer_class: 'PreTrainedTokenizerFast',
  };
  return cfg;
}

// Round trip through a fresh load of the written file: every held-out address
// and a string with every byte class must decode to exactly what went in.
async function verify(file) {
  const t = tk.Tokenizer.fromFile(file);
  if (t.getVocabSize(true) !== C.VOCAB_SIZE) throw new Error(`verify: vocab ${t.getVocabSize(true)} != ${C.VOCAB_SIZE}`);
  const texts = [];
  for (const s of ['val', 'test']) texts.push(...fs.readFileSync(path.join(C.DATA_DIR, `${s}.txt`), 'utf8').split('\n\n'));
  let odd = '';
  for (let cp = 1; cp < 0x250; cp++) odd += String.fromCodePoint(cp);
  texts.push(odd + ' 日本語 😀 \t\r\n  spaces  ');
  let nTok = 0, nBytes = 0;
  for (const text of texts) {
    const enc = await t.encode(text);
    const ids = enc.getIds();
    if (ids[0] !== C.SPECIAL_TOKENS.indexOf(C.BOS)) throw new Error('verify: encode(text) does not start with <|bos|>');
    const back = await t.decode(ids, true);
    if (back !== text) throw new Error(`verify: round trip failed on text starting ${JSON.stringify(text.slice(0, 60))}`);
    nTok += ids.length - 1;
    nBytes += Buffer.byteLength(text);
  }
  for (const s of C.SPECIAL_TOKENS) {
    const ids = (await t.encode(`a${s}b`, null, { addSpecialTokens: false })).getIds();
    if (ids.length !== 3 || ids[1] !== C.SPECIAL_TOKENS.indexOf(s)) throw new Error(`verify: ${s} is not one token: ${ids}`);
  }
  console.log(`round trip ok on ${texts.length} texts; held-out: ${(nBytes / nTok).toFixed(3)} bytes/token`);
}

async function main() {
  const trainFile = path.join(C.DATA_DIR, 'train.txt');
  if (!fs.existsSync(trainFile)) throw new Error(`train_tokenizer: ${trainFile} missing: run prepare_data.js first`);
  const { vocab, merges } = buildVocab(trainFullMerges(trainFile));
  fs.mkdirSync(C.MODEL_DIR, { recursive: true });
  const out = path.join(C.MODEL_DIR, 'tokenizer.json');
  fs.writeFileSync(out, JSON.stringify(tokenizerJson(vocab, merges), null, 1) + '\n');
  fs.writeFileSync(path.join(C.MODEL_DIR, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig(vocab), null, 2) + '\n');
  console.log(`wrote ${out}: ${Object.keys(vocab).length} tokens, ${merges.length} merges`);
  await verify(out);
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
