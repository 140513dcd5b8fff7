// Step 3: tokenizes the splits with the model's tokenizer (npm `tokenizers`)
// into flat uint16 token streams that train.py reads; chat samples are
// rendered with the shipped chat template (npm @huggingface/jinja).
//
//   node tools/default_model/encode_data.js [--preset eval]
//
// Writes data/{train,val,test}_{docs,chat}.bin (little-endian uint16 ids) and
// data/meta.json (token and byte counts, special ids); the eval preset has no
// chat stream.
//   docs stream: per document  <|bos|> text <|endoftext|>
//   chat stream: per sample    template(messages) <|endoftext|>
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const tk = require('tokenizers');
const { Template } = require('@huggingface/jinja');
const C = require('./common');

async function encodeAll(tok, texts, addSpecialTokens) {
  const out = [];
  const BATCH = 256;
  for (let i = 0; i < texts.length; i += BATCH) {
    const encs = await tok.encodeBatch(texts.slice(i, i + BATCH), { addSpecialTokens });
    for (const e of encs) out.push(e.getIds());
  }
  return out;
}

function writeStream(file, seqs, eot) {
  let n = 0;
  for (const s of seqs) n += s.length + 1;
  const buf = new Uint16Array(n);
  let k = 0;
  for (const s of seqs) {
    buf.set(s, k);
    k += s.length;
    buf[k++] = eot;
  }
  // Uint16Array is host-endian; x86-64 and arm64 hosts are little-endian.
  fs.writeFileSync(file, Buffer.from(buf.buffer));
  return n;
}

async function main() {
  const tokFile = path.join(C.MODEL_DIR, 'tokenizer.json');
  const tok = tk.Tokenizer.fromFile(tokFile);
  const cfg = JSON.parse(fs.readFileSync(path.join(C.MODEL_DIR, 'tokenizer_config.json'), 'utf8'));
  const template = C.CHAT ? new Template(cfg.chat_template) : null;
  const eot = tok.tokenToId(C.EOT);
  const meta = { preset: C.PRESET, tokenizer: path.relative(C.REPO_ROOT, tokFile),
    tokenizer_sha256: crypto.createHash('sha256').update(fs.readFileSync(tokFile)).digest('hex'),
    vocab_size: tok.getVocabSize(true),
    special: Object.fromEntries(C.SPECIAL_TOKENS.map((t) => [t, tok.tokenToId(t)])), files: {} };
  for (const split of ['train', 'val', 'test']) {
    const docs = fs.readFileSync(path.join(C.DATA_DIR, `${split}.txt`), 'utf8').replace(/\n$/, '').split('\n\n');
    const docIds = await encodeAll(tok, docs, true);
    const nDoc = writeStream(path.join(C.DATA_DIR, `${split}_docs.bin`), docIds, eot);
    meta.files[`${split}_docs.bin`] = { tokens: nDoc, sequences: docs.length,
      text_bytes: docs.reduce((s, d) => s + Buffer.byteLength(d), 0) };
    if (!C.CHAT) {
      console.log(`${split}: docs ${nDoc} tokens`);
      continue;
    }

    const chats = fs.readFileSync(path.join(C.DATA_DIR, `chat_${split}.jsonl`), 'utf8').trim().split('\n')
      .map((l) => JSON.parse(l).messages);
    const rendered = chats.map((m) => template.render({ messages: m, bos_token: cfg.bos_token, add_generation_prompt: false }));
    const chatIds = await encodeAll(tok, rendered, false);
    const nChat = writeStream(path.join(C.DATA_DIR, `${split}_chat.bin`), chatIds, eot);
    meta.files[`${split}_chat.bin`] = { tokens: nChat, sequences: chats.length,
      text_bytes: rendered.reduce((s, d) => s + Buffer.byteLength(d), 0) };
    console.log(`${split}: docs ${nDoc} tokens, chat ${nChat} tokens`);
    if (split === 'train') meta.example_chat = { text: rendered[0], ids: chatIds[0].slice(0, 40) };
  }
  fs.writeFileSync(path.join(C.DATA_DIR, 'meta.json'), JSON.stringify(meta, null, 1) + '\n');
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
