// Checks the golden's text side with npm `tokenizers` and @huggingface/jinja:
// the prompt ids (chat prompts rendered with the shipped chat template) and
// the decoded greedy text must equal what transformers recorded.
//   node tools/default_model/check_golden_tokens.js
'use strict';

const fs = require('fs');
const path = require('path');
const tk = require('tokenizers');
const { Template } = require('@huggingface/jinja');
const C = require('./common');

async function main() {
  const tok = tk.Tokenizer.fromFile(path.join(C.MODEL_DIR, 'tokenizer.json'));
  const cfg = JSON.parse(fs.readFileSync(path.join(C.MODEL_DIR, 'tokenizer_config.json'), 'utf8'));
  const golden = JSON.parse(fs.readFileSync(path.join(C.MODEL_DIR, 'golden_greedy.json'), 'utf8'));
  let bad = 0;
  const check = (what, ok) => {
    console.log(`${ok ? 'ok      ' : 'MISMATCH'} ${what}`);
    if (!ok) bad++;
  };
  for (const c of golden.cases) {
    let text = c.prompt;
    if (c.messages) {
      text = new Template(cfg.chat_template).render({ messages: c.messages, bos_token: cfg.bos_token,
        add_generation_prompt: c.add_generation_prompt });
      check(`${c.name}: rendered chat template`, text === c.prompt_text);
    }
    const ids = (await tok.encode(text, null, { addSpecialTokens: c.add_special_tokens })).getIds();
    check(`${c.name}: prompt ids`, JSON.stringify(ids) === JSON.stringify(c.prompt_ids));
    check(`${c.name}: greedy text`, (await tok.decode(c.greedy_ids, false)) === c.greedy_text);
  }
  if (bad) {
    console.error('check_golden_tokens: FAILED');
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
