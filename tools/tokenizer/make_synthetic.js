// Writes small synthetic tokenizer.json files to tests/fixtures/tokenizer/synthetic/, each exercising
// components the five real tokenizers do not use (other normalizers, pre-tokenizers, decoders,
// post-processors, added-token flags, unk/fuse_unk, ignore_merges, subword prefix/suffix).
// Their vocab and merges come from a tiny BPE trained here on the corpus; npm tokenizers then produces
// the goldens (make_goldens.js). Run from the repo root: node tools/tokenizer/make_synthetic.js
'use strict';
const fs = require('fs');
const path = require('path');
const { makeCorpus, entryText } = require('./corpus.js');

const OUT = path.resolve(__dirname, '..', '..', 'tests', 'fixtures', 'tokenizer', 'synthetic');

// GPT-2 byte alphabet (same table as ByteLevel).
function byteChars() {
  const out = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out.push(String.fromCodePoint(printable ? b : 256 + n++));
  }
  return out;
}

// Greedy BPE training: words are arrays of symbols; merging (a, b) makes a + b without b's prefix.
function train(words, nMerges, prefix) {
  const merges = [];
  const vocabAdd = [];
  const seen = new Set();
  for (let m = 0; m < nMerges; m++) {
    const counts = new Map();
    for (const w of words)
      for (let i = 0; i + 1 < w.length; i++) {
        const k = w[i] + '\u0000' + w[i + 1];
        counts.set(k, (counts.get(k) || 0) + 1);
      }
    let best = null, bestN = 1;
    for (const [k, n] of counts) if (n > bestN || (n === bestN && best !== null && k < best)) { best = k; bestN = n; }
    if (best === null) break;
    const [a, b] = best.split('\u0000');
    const merged = a + (prefix && b.startsWith(prefix) ? b.slice(prefix.length) : b);
    merges.push([a, b]);
    if (!seen.has(merged)) { seen.add(merged); vocabAdd.push(merged); }
    for (const w of words)
      for (let i = 0; i + 1 < w.length; i++)
        if (w[i] === a && w[i + 1] === b) w.splice(i, 2, merged);
  }
  return { merges, vocabAdd };
}

function buildVocab(base, extra, startId) {
  const vocab = {};
  let id = startId;
  for (const t of [...base, ...extra]) if (!(t in vocab)) vocab[t] = id++;
  return vocab;
}

const texts = makeCorpus().map(entryText).filter((t) => t.length);
const words = (re) => texts.flatMap((t) => t.match(re) || []);

function addedTokens(list, startId) {
  return list.map((t, i) => ({ id: startId + i, content: t.content, single_word: !!t.single_word, lstrip: !!t.lstrip,
    rstrip: !!t.rstrip, normalized: !!t.normalized, special: !!t.special }));
}

function byteLevelModel(nMerges, extra = {}) {
  const bc = byteChars();
  const enc = (s) => Array.from(Buffer.from(s, 'utf8')).map((b) => bc[b]);
  const w = words(/ ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+/g).map(enc);
  const { merges, vocabAdd } = train(w, nMerges, '');
  const vocab = buildVocab(bc, vocabAdd, 0);
  return { vocab, merges, size: Object.keys(vocab).length, model: { type: 'BPE', dropout: null, unk_token: null,
    continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
    vocab, merges, ...extra } };
}

function charModel(nMerges, { prefix = '', suffix = '', byteFallback = false, fuseUnk = false, ignoreMerges = false,
  charFilter = () => true, mergesAsStrings = false, wordRe = /▁?[^▁]+/g, replaceSpace = true } = {}) {
  const src = texts.map((t) => (replaceSpace ? '▁' + t.replace(/ /g, '▁') : t));
  const w = src.flatMap((t) => t.match(wordRe) || []).map((s) => {
    const cs = Array.from(s).filter(charFilter);
    return cs.map((c, i) => (i > 0 ? prefix : '') + c + (i === cs.length - 1 ? suffix : ''));
  }).filter((x) => x.length);
  const base = new Set();
  for (const x of w) for (const s of x) base.add(s);
  const { merges, vocabAdd } = train(w, nMerges, prefix);
  const bytes = byteFallback ? Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`) : [];
  const vocab = buildVocab(['<unk>', '<s>', '</s>', ...bytes, ...[...base].sort()], vocabAdd, 0);
  return { vocab, size: Object.keys(vocab).length, model: { type: 'BPE', dropout: null, unk_token: '<unk>',
    continuing_subword_prefix: prefix || null, end_of_word_suffix: suffix || null, fuse_unk: fuseUnk, byte_fallback: byteFallback,
    ignore_merges: ignoreMerges, vocab, merges: mergesAsStrings ? merges.map(([a, b]) => `${a} ${b}`) : merges } };
}

function write(name, tok) {
  const s = JSON.stringify({ version: '1.0', truncation: null, padding: null, ...tok });
  fs.writeFileSync(path.join(OUT, `${name}.json`), s + '\n');
  console.log(`${name}: ${(s.length / 1024).toFixed(0)} KiB`);
}

fs.mkdirSync(OUT, { recursive: true });

// 1. Byte-level with the ByteLevel regex and prefix space, NFKC/Strip/Replace normalizers, a BOS/EOS
//    template, and added tokens with every flag.
{
  const m = byteLevelModel(300);
  write('bytelevel_template', {
    added_tokens: addedTokens([
      { content: '<s>', special: true }, { content: '</s>', special: true }, { content: '[MASK]', special: true, lstrip: true },
      { content: '<sep>', rstrip: true }, { content: 'word', single_word: true, normalized: true },
      { content: 'ﬁx', normalized: true }, { content: '<|im_end|>', special: true, lstrip: true, rstrip: true },
      { content: 'the', single_word: true },
    ], m.size),
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Strip', strip_left: true, strip_right: true },
      { type: 'Replace', pattern: { Regex: '\\s{3,}' }, content: '   ' }] },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    post_processor: { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } }], pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [m.size], tokens: ['<s>'] }, '</s>': { id: '</s>', ids: [m.size + 1], tokens: ['</s>'] } } }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: m.model,
  });
}

// 2. Byte-level under a mix of pre-tokenizers (Split with every behaviour and invert, Digits,
//    Punctuation, Whitespace-free ByteLevel), Lowercase, Bert post-processor, decoder chain.
{
  const m = byteLevelModel(250);
  write('pretok_mix', {
    added_tokens: addedTokens([{ content: '[CLS]', special: true }, { content: '[SEP]', special: true }], m.size),
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFC' }, { type: 'Lowercase' }] },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { Regex: '[,;]+' }, behavior: 'Contiguous', invert: false },
      { type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'MergedWithPrevious', invert: true },
      { type: 'Split', pattern: { String: '//' }, behavior: 'Removed', invert: false },
      { type: 'Digits', individual_digits: true },
      { type: 'Punctuation', behavior: 'Isolated' },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'BertProcessing', sep: ['[SEP]', m.size + 1], cls: ['[CLS]', m.size] },
    decoder: { type: 'Sequence', decoders: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }, { type: 'Replace', pattern: { String: 'the' }, content: 'THE' },
      { type: 'Strip', content: '.', start: 0, stop: 2 }] },
    model: m.model,
  });
}

// 3. SentencePiece style with Metaspace (prepend_scheme first), NFD + StripAccents, byte fallback, unk.
{
  const m = charModel(300, { byteFallback: true, charFilter: (c) => c.codePointAt(0) < 0x3000 });
  write('metaspace_fallback', {
    added_tokens: addedTokens([{ content: '<unk>', special: true }, { content: '<s>', special: true }, { content: '</s>', special: true }], 0)
      .map((t, i) => ({ ...t, id: i })).concat(addedTokens([{ content: '<|user|>', special: true, rstrip: true }], m.size)),
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFD' }, { type: 'StripAccents' }] },
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true },
    post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [{ type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true },
      { type: 'ByteFallback' }, { type: 'Fuse' }] },
    model: m.model,
  });
}

// 4. Metaspace (always, no split) with an ASCII-letter vocab: every other character is <unk>, not
//    fused; ignore_merges; merges in the "a b" string form; NFKD + Replace normalizer.
{
  const m = charModel(200, { ignoreMerges: true, mergesAsStrings: true, charFilter: (c) => /[a-z▁]/.test(c) });
  write('metaspace_unk', {
    added_tokens: addedTokens([{ content: '<unk>', special: true }], 0),
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKD' }, { type: 'Replace', pattern: { String: 'A' }, content: 'a' }] },
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: false },
    post_processor: null,
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: false },
    model: m.model,
  });
}

// 5. Word-piece-like BPE: "##" continuing-subword prefix and "</w>" suffix, fused unk, BertPreTokenizer,
//    Prepend normalizer, WhitespaceSplit, no decoder (tokens joined by spaces).
{
  const m = charModel(250, { prefix: '##', suffix: '</w>', fuseUnk: true, replaceSpace: false, wordRe: /[A-Za-z0-9]+|[^\sA-Za-z0-9]/g,
    charFilter: (c) => c.codePointAt(0) < 0x250 });
  write('subword_affixes', {
    added_tokens: addedTokens([{ content: '<unk>', special: true }], 0),
    normalizer: { type: 'Prepend', prepend: 'x' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'BertPreTokenizer' }, { type: 'WhitespaceSplit' }] },
    post_processor: null,
    decoder: null,
    model: m.model,
  });
}

// 6. Whitespace pre-tokenizer, Digits (contiguous), Punctuation (Removed), Lowercase, Strip decoder,
//    single_word added tokens.
{
  const m = byteLevelModel(200);
  write('whitespace_digits', {
    // single_word tokens under a normalizer that keeps ①, ², Ⅻ and marks as they are.
    added_tokens: addedTokens([{ content: 'word', single_word: true }, { content: 'the', single_word: true, normalized: true }], m.size),
    normalizer: { type: 'Lowercase' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Whitespace' }, { type: 'Digits', individual_digits: false },
      { type: 'Punctuation', behavior: 'Removed' }, { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'RobertaProcessing', sep: ['</s>', 2], cls: ['<s>', 0], trim_offsets: true, add_prefix_space: true },
    decoder: { type: 'Sequence', decoders: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: m.model,
  });
}

// 7. GPT-2 shape: ByteLevel pre-tokenizer with its own regex and no prefix space (arbor's fast path),
//    ByteLevel decoder, no normalizer, one special token.
{
  const m = byteLevelModel(300);
  write('gpt2_style', {
    added_tokens: addedTokens([{ content: '<|endoftext|>', special: true }], m.size),
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: m.model,
  });
}
