// Shared constants of the model pipelines: paths, the special tokens and their
// ids, and the chat template, so every script agrees on them. Two presets:
// `default` makes the shipped models/arbor-tiny-sotu; `eval` (chosen with
// `--preset eval` on any node step) makes the evaluation model beside the
// tests, tests/fixtures/eval-model (see tools/eval_model/README.md).
'use strict';

const path = require('path');

const REPO_ROOT = path.resolve(__dirname, '..', '..');

// Special tokens take ids 0..4, in this order (as the HF BPE trainer does when
// given special_tokens): pad, bos, end of document, ChatML turn start and end.
const SPECIAL_TOKENS = ['<|pad|>', '<|bos|>', '<|endoftext|>', '<|im_start|>', '<|im_end|>'];
const PAD = '<|pad|>';
const BOS = '<|bos|>';
const EOT = '<|endoftext|>';     // ends a raw document and a whole conversation
const IM_START = '<|im_start|>';
const IM_END = '<|im_end|>';     // ends a turn: the chat eos, generation stops here

// ChatML with a leading bos. The rendered text is tokenized WITHOUT the
// post-processor's bos (add_special_tokens=false), as HF apply_chat_template does.
const CHAT_TEMPLATE =
  "{{ bos_token }}{% for message in messages %}" +
  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
  "{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Per preset: where the model's tokenizer files go, where the data lives, the
// total vocabulary (special tokens included; a power of two, inside uint16 for
// the .bin files), whether there is a chat stream and template, the
// eos token, and the training context (also max_position_embeddings).
const PRESETS = {
  default: {
    MODEL_NAME: 'arbor-tiny-sotu',
    MODEL_DIR: path.join(REPO_ROOT, 'models', 'arbor-tiny-sotu'),
    DATA_DIR: path.join(__dirname, 'data'),
    VOCAB_SIZE: 8192,
    CHAT: true,
    EOS: IM_END,
    CONTEXT: 1024,
  },
  // Plain text only (no chat samples, no chat template): documents end in
  // <|endoftext|>, which is therefore the eos.
  eval: {
    MODEL_NAME: 'arbor-eval-8m',
    MODEL_DIR: path.join(REPO_ROOT, 'tests', 'fixtures', 'eval-model'),
    DATA_DIR: path.join(REPO_ROOT, 'tools', 'eval_model', 'data'),
    VOCAB_SIZE: 4096,
    CHAT: false,
    EOS: EOT,
    CONTEXT: 1024,
  },
};

function presetName(argv) {
  const i = argv.indexOf('--preset');
  if (i < 0) return 'default';
  const name = argv[i + 1];
  if (!(name in PRESETS)) {
    throw new Error(`--preset: '${name}' is not one of ${Object.keys(PRESETS).join(', ')}`);
  }
  return name;
}

const PRESET = presetName(process.argv);

module.exports = {
  REPO_ROOT, PRESET, PRESETS, SPECIAL_TOKENS, PAD, BOS, EOT, IM_START, IM_END, CHAT_TEMPLATE,
  ...PRESETS[PRESET],
};
