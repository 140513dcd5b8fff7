// `arbor perplexity` from the command line, on the shipped default model (no --model): the --json fields
// and their consistency with the windows the tokenizers library's ids give, --save-logits then --kl-base
// against itself (KL 0, top-1 agreement 1), and the errors for a file that is not a logits file and for
// one made with another --ctx.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Tokenizer } from 'tokenizers';
import { ARBOR, SRC, deadline } from './lib.mjs';

deadline(300000);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-ppl-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
const text = fs.readFileSync(path.join(SRC, 'tests', 'fixtures', 'perplexity', 'sotu_heldout.txt'), 'utf8').slice(0, 1500);
const file = path.join(dir, 'text.txt');
fs.writeFileSync(file, text);
const CTX = 64;

function ppl(...args) {
  const r = spawnSync(ARBOR, ['perplexity', '--file', file, '--threads', '2', ...args], { encoding: 'utf8' });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
function lastJson(stdout) {
  const lines = stdout.trim().split('\n');
  return JSON.parse(lines[lines.length - 1]);
}

const tok = await Tokenizer.fromFile(path.join(SRC, 'models', 'arbor-tiny-sotu', 'tokenizer.json'));
const [enc] = await tok.encodeBatch([text], { addSpecialTokens: true });
const nIds = enc.getIds().length;
let predicted = 0;
for (let b = 0; b < nIds; b += CTX) { const len = Math.min(CTX, nIds - b); if (len >= 2) predicted += len - 1; }

test('arbor help lists perplexity', () => {
  const r = spawnSync(ARBOR, ['help'], { encoding: 'utf8' });
  assert.match(r.stdout, /perplexity/);
});

test('--json: one object on the last line, consistent with the windows', () => {
  const r = ppl('--ctx', String(CTX), '--json');
  assert.equal(r.code, 0, r.stderr);
  const o = lastJson(r.stdout);
  assert.equal(o.ids, nIds);
  assert.equal(o.tokens, predicted);
  assert.equal(o.windows, Math.ceil(nIds / CTX) - (nIds % CTX === 1 ? 1 : 0));
  assert.ok(o.perplexity > 1 && o.perplexity < 8192, `perplexity ${o.perplexity}`);
  assert.ok(Math.abs(Math.log(o.perplexity) - o.nll_sum / o.tokens) < 1e-9);
  assert.ok(o.perplexity_stderr > 0 && o.perplexity_stderr < o.perplexity);
  assert.ok(o.tokens_per_second > 0);
  assert.equal(o.kl_mean, undefined);
  // Without --json: the human line names the same perplexity and count.
  const h = ppl('--ctx', String(CTX));
  assert.equal(h.code, 0, h.stderr);
  assert.match(h.stdout, new RegExp(`perplexity ${o.perplexity.toFixed(4)} ± [0-9.]+ over ${predicted} predicted ids`));
});

test('--save-logits then --kl-base against itself: KL 0, top-1 agreement 1', () => {
  const base = path.join(dir, 'base.ppl');
  const a = ppl('--ctx', String(CTX), '--json', '--save-logits', base, '--kl-top-k', '16');
  assert.equal(a.code, 0, a.stderr);
  assert.equal(fs.statSync(base).size, 64 + Buffer.byteLength(fs.readFileSync(base).subarray(64, 64 + fs.readFileSync(base).readUInt32LE(56))) + predicted * (8 + 16 * 8));
  const b = ppl('--ctx', String(CTX), '--json', '--kl-base', base);
  assert.equal(b.code, 0, b.stderr);
  const o = lastJson(b.stdout);
  for (const k of ['kl_mean', 'kl_p99', 'kl_max']) assert.equal(o[k], 0, k);
  assert.equal(o.top1_agreement, 1);
  assert.equal(o.ppl_base, lastJson(a.stdout).perplexity);
  assert.equal(o.perplexity, o.ppl_base);
  assert.equal(o.kl_top_k, 16);
  const h = ppl('--ctx', String(CTX), '--kl-base', base);
  assert.match(h.stdout, /KL\(base \|\| this\) over the base's top-16 \+ rest: mean 0,/);
  assert.match(h.stdout, /top-1 agreement 100\.000 %/);
});

test('a bad --kl-base file is refused with a clear error', () => {
  const notLogits = path.join(dir, 'not.ppl');
  fs.writeFileSync(notLogits, 'this is just some text, long enough to hold a header of sixty-four bytes......');
  const r = ppl('--ctx', String(CTX), '--kl-base', notLogits);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /arbor perplexity: .*not\.ppl is not an arbor perplexity logits file/);
  const missing = ppl('--ctx', String(CTX), '--kl-base', path.join(dir, 'missing.ppl'));
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /missing\.ppl/);
  const base = path.join(dir, 'ctx32.ppl');
  assert.equal(ppl('--ctx', '32', '--save-logits', base, '--kl-top-k', '4').code, 0);
  const other = ppl('--ctx', String(CTX), '--kl-base', base);
  assert.equal(other.code, 1);
  assert.match(other.stderr, /made with --ctx 32, this run uses --ctx 64/);
  const noFile = spawnSync(ARBOR, ['perplexity', '--ctx', '8'], { encoding: 'utf8' });
  assert.equal(noFile.status, 1);
  assert.match(noFile.stderr, /--file TEXT is required/);
});
