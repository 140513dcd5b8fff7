// --chat-template NAME: a built-in template for models that ship none ("chatml", as llama.cpp offers
// it). The prompt it renders is checked token for token against the ChatML text written out here and
// encoded by the HF `tokenizers` binding; a chat request is then answered with it.
import test from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Tokenizer } from 'tokenizers';
import { ARBOR, startServer, deadline, testModel, post } from './lib.mjs';

deadline(90000);

test('--chat-template chatml renders ChatML', async () => {
  const s = await startServer(['--chat-template', 'chatml']);
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

test('--chat-template: neither a file nor a built-in name is a clear error', () => {
  const r = spawnSync(ARBOR, ['serve', '--model', testModel(), '--chat-template', 'no-such-template', '--port', '0'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /--chat-template no-such-template: no such file, and not a built-in template \(chatml\)/);
});
