// --chat-template NAME: a built-in template for models that ship none ("chatml", as llama.cpp offers
// it). The model here is the test model without its tokenizer_config.json (so without a template).
// The prompt the flag renders is checked token for token against the ChatML text written out here and
// encoded by the HF `tokenizers` binding; a chat request is then answered with it.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Tokenizer } from 'tokenizers';
import { ARBOR, startServer, deadline, testModel, post } from './lib.mjs';

deadline(90000);

// The test model's weights and tokenizer.json, but no tokenizer_config.json: no chat template.
const bare = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-notemplate-'));
process.on('exit', () => fs.rmSync(bare, { recursive: true, force: true }));
for (const f of fs.readdirSync(testModel()))
  if (f !== 'tokenizer_config.json') fs.symlinkSync(path.join(testModel(), f), path.join(bare, f));

test('--chat-template chatml renders ChatML', async () => {
  const none = await startServer([], { model: bare });
  try {
    const r = await post(`${none.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /no chat template/);
  } finally {
    await none.stop();
  }
  const s = await startServer(['--chat-template', 'chatml'], { model: bare });
  try {
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }];
    const text = '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n';
    const tok = await Tokenizer.fromFile(path.join(testModel(), 'tokenizer.json'));
    const [enc] = await tok.encodeBatch([text], { addSpecialTokens: false });
    const r = await post(`${s.url}/tokenize`, { messages });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.body.tokens, enc.getIds());
    const chat = await post(`${s.baseURL}/chat/completions`, { messages, max_tokens: 2 });
    assert.equal(chat.status, 200, chat.text);
    assert.equal(chat.body.usage.prompt_tokens, enc.getIds().length);
  } finally {
    await s.stop();
  }
});

test('generate --chat and chat take --chat-template too', async () => {
  const text = '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n';
  const tok = await Tokenizer.fromFile(path.join(testModel(), 'tokenizer.json'));
  const [enc] = await tok.encodeBatch([text], { addSpecialTokens: false });
  const g = spawnSync(ARBOR, ['generate', '--model', bare, '--threads', '1', '--chat', '--chat-template', 'chatml', '--system', 'Be brief.',
    '--prompt', 'Hi there', '--max-tokens', '1'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(g.status, 0, g.stderr);
  assert.match(g.stderr, new RegExp(`prefill: ${enc.getIds().length} tokens`));
  const without = spawnSync(ARBOR, ['generate', '--model', bare, '--threads', '1', '--chat', '--prompt', 'Hi there'], { encoding: 'utf8' });
  assert.equal(without.status, 1);  // no template of its own
  const c = spawnSync(ARBOR, ['chat', '--model', bare, '--threads', '1', '--chat-template', 'chatml', '--max-tokens', '2'],
    { encoding: 'utf8', input: 'Hi there\n', timeout: 30000 });
  assert.equal(c.status, 0, c.stderr);
  const bad = spawnSync(ARBOR, ['generate', '--model', testModel(), '--chat-template', 'chatml', '--prompt', 'x'], { encoding: 'utf8' });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /--chat-template applies with --chat only/);
});

test('--chat-template: neither a file nor a built-in name is a clear error', () => {
  const r = spawnSync(ARBOR, ['serve', '--model', testModel(), '--chat-template', 'no-such-template', '--port', '0'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /--chat-template no-such-template: no such file, and not a built-in template \(chatml\)/);
});
