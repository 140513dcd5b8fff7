// The token endpoints: POST /tokenize and /detokenize in vLLM's and llama.cpp's shapes, Anthropic's
// POST /v1/messages/count_tokens, and GET /version. References: the HF `tokenizers` binding for text,
// @huggingface/jinja + `tokenizers` for chat prompts, and the prompt_tokens / input_tokens that the
// generating endpoints report for the same body.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import { ARBOR, SRC, startServer, deadline, testModel, post } from './lib.mjs';

deadline(120000);
const server = await startServer();
test.after(async () => { await server.stop(); });
const url = server.baseURL.replace(/\/v1$/, '');

const tok = await Tokenizer.fromFile(path.join(testModel(), 'tokenizer.json'));
const cfg = JSON.parse(fs.readFileSync(path.join(testModel(), 'tokenizer_config.json'), 'utf8'));
const template = new Template(cfg.chat_template);
async function reference(text, addSpecialTokens) {
  const [enc] = await tok.encodeBatch([text], { addSpecialTokens });
  return enc.getIds();
}
const TEXT = 'Tokenizers split "naïve café" and 12345 into pieces — even emoji 🤖 and\ttabs.';

test('/tokenize: prompt and content match the reference tokenizer', async () => {
  const a = await post(`${url}/tokenize`, { prompt: TEXT });
  assert.equal(a.status, 200, a.text);
  assert.deepEqual(a.body.tokens, await reference(TEXT, true));
  assert.equal(a.body.count, a.body.tokens.length);
  assert.ok(a.body.max_model_len > 0);
  const c = await post(`${url}/tokenize`, { content: TEXT });  // llama.cpp's shape: no special tokens by default
  assert.equal(c.status, 200, c.text);
  assert.deepEqual(c.body.tokens, await reference(TEXT, false));
  const p = await post(`${url}/tokenize`, { content: 'hello world, again', with_pieces: true });
  assert.deepEqual(p.body.tokens.map((t) => t.id), await reference('hello world, again', false));
  assert.equal(p.body.tokens.map((t) => t.piece).join(''), 'hello world, again');
  const special = await post(`${url}/tokenize`, { content: TEXT, add_special: true });
  assert.deepEqual(special.body.tokens, await reference(TEXT, true));
});

test('/detokenize inverts /tokenize', async () => {
  const ids = await reference(TEXT, false);
  const r = await post(`${url}/detokenize`, { tokens: ids });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.prompt, TEXT);
  assert.equal(r.body.content, TEXT);
  const bad = await post(`${url}/detokenize`, { tokens: [1, 2, -5] });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.param, 'tokens[2]');
  assert.equal((await post(`${url}/detokenize`, { tokens: 'abc' })).status, 400);
});

test('/tokenize of messages is the chat prompt /v1/chat/completions counts', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2 + 2?' }];
  const r = await post(`${url}/tokenize`, { messages });
  assert.equal(r.status, 200, r.text);
  const text = template.render({ messages, add_generation_prompt: true, bos_token: '', eos_token: '<|im_end|>' });
  assert.deepEqual(r.body.tokens, await reference(text, false));
  const chat = await post(`${server.baseURL}/chat/completions`, { messages, max_tokens: 1 });
  assert.equal(chat.body.usage.prompt_tokens, r.body.count);
  const noGen = await post(`${url}/tokenize`, { messages, add_generation_prompt: false });
  assert.ok(noGen.body.count < r.body.count, `${noGen.body.count} vs ${r.body.count}`);
  const both = await post(`${url}/tokenize`, { prompt: 'a', messages });
  assert.equal(both.status, 400);
  assert.match(both.body.error.message, /exactly one of/);
});

test('/v1/messages/count_tokens is the input /v1/messages reports', async () => {
  const body = {
    system: 'You answer in one word.',
    messages: [{ role: 'user', content: 'Capital of France?' }],
    tools: [{ name: 'lookup', description: 'Look a fact up', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
  };
  const count = await post(`${server.baseURL}/messages/count_tokens`, body);
  assert.equal(count.status, 200, count.text);
  const msg = await post(`${server.baseURL}/messages`, { ...body, max_tokens: 1 });
  assert.equal(msg.status, 200, msg.text);
  assert.equal(count.body.input_tokens, msg.body.usage.input_tokens + msg.body.usage.cache_read_input_tokens);
  const noTools = await post(`${server.baseURL}/messages/count_tokens`, { ...body, tools: undefined });
  assert.ok(noTools.body.input_tokens < count.body.input_tokens);
  const bad = await post(`${server.baseURL}/messages/count_tokens`, { messages: [{ role: 'robot', content: 'x' }] });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.type, 'error');  // Anthropic's error shape
  assert.match(bad.body.error.message, /messages\[0\]\.role/);
});

test('special tokens: added by default for prompt (vLLM), not for content (llama.cpp)', async () => {
  // Mistral's tokenizer (@lenml's "llama2") adds <s> (Qwen3's adds nothing), served with the same test model.
  const dir = path.join(SRC, 'node_modules', '@lenml', 'tokenizer-llama2', 'models');
  const llama = await startServer(['--tokenizer', dir]);
  try {
    const ref = await Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    const refIds = async (add) => (await ref.encodeBatch([TEXT], { addSpecialTokens: add }))[0].getIds();
    const base = llama.baseURL.replace(/\/v1$/, '');
    const cases = [[{ prompt: TEXT }, true], [{ prompt: TEXT, add_special_tokens: false }, false],
      [{ content: TEXT }, false], [{ content: TEXT, add_special: true }, true]];
    for (const [body, add] of cases) {
      const r = await post(`${base}/tokenize`, body);
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body.tokens, await refIds(add), JSON.stringify(body));
    }
    assert.notDeepEqual(await refIds(true), await refIds(false));
    const d = await post(`${base}/detokenize`, { tokens: await refIds(true) });
    assert.ok(d.body.content.startsWith('<s>'), d.body.content);  // special tokens kept
  } finally {
    await llama.stop();
  }
});

test('GET /version is the commit arbor --version names', async () => {
  const r = await fetch(`${url}/version`);
  assert.equal(r.status, 200);
  const v = (await r.json()).version;
  assert.equal(`arbor ${v}`, spawnSync(ARBOR, ['--version'], { encoding: 'utf8' }).stdout.split('\n')[0]);
});
