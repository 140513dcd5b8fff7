// Tools and reasoning through the openai SDK. The prompt the server renders (tools, past tool calls, tool
// results, enable_thinking / reasoning_effort) is checked against the reference: @huggingface/jinja renders
// the same template and the HF `tokenizers` binding counts its tokens. The random-weight test model does not
// choose to call tools, so the output side is driven with logit_bias: a forced <think> must come back as
// reasoning_content, a forced unterminated <tool_call> must stay content. (The parsers themselves are
// unit-tested on real call markup in tests/server/chat_output_test.cpp.)
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import { startServer, deadline, testModel } from './lib.mjs';

deadline(120000);
const server = await startServer();
const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
test.after(async () => { await server.stop(); });

const cfg = JSON.parse(fs.readFileSync(path.join(testModel(), 'tokenizer_config.json'), 'utf8'));
const template = new Template(cfg.chat_template);
const tok = await Tokenizer.fromFile(path.join(testModel(), 'tokenizer.json'));
async function referenceTokens(messages, tools, kwargs = {}) {
  const text = template.render({ messages, tools, add_generation_prompt: true, bos_token: '', eos_token: '<|im_end|>', ...kwargs });
  const [enc] = await tok.encodeBatch([text], { addSpecialTokens: false });
  return enc.getIds().length;
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const user = { role: 'user', content: 'What is the weather in Paris?' };
const THINK = 151667, TOOL_CALL = 151657;

test('tool-call round trip renders tools, the call and the result as the reference does', async () => {
  const first = await client.chat.completions.create({ messages: [user], tools, max_tokens: 4, temperature: 0 });
  assert.equal(first.usage.prompt_tokens, await referenceTokens([user], tools));
  const call = { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
  const convo = [user, { role: 'assistant', content: '', tool_calls: [call] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' }];
  const second = await client.chat.completions.create({ messages: convo, tools, max_tokens: 4, temperature: 0 });
  const refConvo = [user, { role: 'assistant', content: '', tool_calls: [{ ...call, function: { name: 'get_weather', arguments: { city: 'Paris' } } }] },
    convo[2]];
  assert.equal(second.usage.prompt_tokens, await referenceTokens(refConvo, tools));
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens + 10);
  // pi's shape: content as text parts, strict tools, developer role mapped to system.
  const parts = await client.chat.completions.create({ messages: [{ role: 'developer', content: 'Be brief.' },
    { role: 'user', content: [{ type: 'text', text: 'What is the weather ' }, { type: 'text', text: 'in Paris?' }] }],
  tools: [{ ...tools[0], function: { ...tools[0].function, strict: true } }], max_completion_tokens: 2, store: false });
  assert.equal(parts.usage.prompt_tokens, await referenceTokens([{ role: 'system', content: 'Be brief.' }, user],
    [{ ...tools[0], function: { ...tools[0].function, strict: true } }]));
  // tool_choice "none" leaves the tools out of the prompt.
  const none = await client.chat.completions.create({ messages: [user], tools, tool_choice: 'none', max_tokens: 1 });
  assert.equal(none.usage.prompt_tokens, await referenceTokens([user], undefined));
});

test('enable_thinking and reasoning_effort reach the template', async () => {
  const on = await client.chat.completions.create({ messages: [user], max_tokens: 1 });
  const off = await client.chat.completions.create({ messages: [user], max_tokens: 1, chat_template_kwargs: { enable_thinking: false } });
  const none = await client.chat.completions.create({ messages: [user], max_tokens: 1, reasoning_effort: 'none' });
  assert.equal(on.usage.prompt_tokens, await referenceTokens([user]));
  assert.equal(off.usage.prompt_tokens, await referenceTokens([user], undefined, { enable_thinking: false }));
  assert.ok(off.usage.prompt_tokens > on.usage.prompt_tokens);
  assert.equal(none.usage.prompt_tokens, off.usage.prompt_tokens);
});

test('thinking text goes to reasoning_content (stream and not)', async () => {
  const r = await client.chat.completions.create({ messages: [user], max_tokens: 5, temperature: 0, logit_bias: { [THINK]: 100 } });
  const m = r.choices[0].message;
  assert.equal(m.content, '');
  assert.equal(m.reasoning_content, '<think>'.repeat(4));  // the first <think> opens the block
  const s = await client.chat.completions.create({ messages: [user], max_tokens: 5, temperature: 0, logit_bias: { [THINK]: 100 }, stream: true });
  let reasoning = '', content = '';
  for await (const c of s) {
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    content += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, m.reasoning_content);
  assert.equal(content, '');
});

test('tool markup that does not parse stays content', async () => {
  const r = await client.chat.completions.create({ messages: [user], tools, max_tokens: 3, temperature: 0, logit_bias: { [TOOL_CALL]: 100 } });
  assert.equal(r.choices[0].message.content, '<tool_call>'.repeat(3));
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.choices[0].finish_reason, 'length');
});
