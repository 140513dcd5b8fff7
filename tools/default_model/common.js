// Shared constants of the default-model pipeline: paths, the special tokens and
// their ids, and the chat template, so every script agrees on them.
'use strict';

const path = require('path');

const REPO_ROOT = path.resolve(__dirname, '..', '..');
const MODEL_NAME = 'arbor-tiny-sotu';
const MODEL_DIR = path.join(REPO_ROOT, 'models', MODEL_NAME);
const DATA_DIR = path.join(__dirname, 'data');

// Total vocabulary, special tokens included. 8192 = 2^13 keeps the embedding
// table at 8192 x hidden and the ids inside uint16 for the .bin files.
const VOCAB_SIZE = 8192;

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

// Training context in tokens; also written as max_position_embeddings.
const CONTEXT = 1024;

module.exports = {
  REPO_ROOT, MODEL_NAME, MODEL_DIR, DATA_DIR, VOCAB_SIZE, SPECIAL_TOKENS,
  PAD, BOS, EOT, IM_START, IM_END, CHAT_TEMPLATE, CONTEXT,
};
