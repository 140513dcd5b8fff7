// --model ORG/NAME: a model already downloaded into the Hugging Face hub cache (blobs, snapshots of
// symlinks, refs/main) is found there, as vLLM and mlx-lm users expect; nothing is downloaded. The
// cache is built here from the test model, in huggingface_hub's layout.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { ARBOR, startServer, deadline, testModel, post } from './lib.mjs';

deadline(90000);
const model = testModel();
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-hfcache-'));
process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));

// <cache>/models--acme--tiny-chat/{blobs/<name>, snapshots/<rev>/<file> -> ../../blobs/<name>, refs/main}
function makeCache(cache, revs, { ref = revs[0] } = {}) {
  const repo = path.join(cache, 'models--acme--tiny-chat');
  fs.mkdirSync(path.join(repo, 'blobs'), { recursive: true });
  for (const f of fs.readdirSync(model)) fs.copyFileSync(path.join(model, f), path.join(repo, 'blobs', `blob-${f}`));
  for (const rev of revs) {
    const snap = path.join(repo, 'snapshots', rev);
    fs.mkdirSync(snap, { recursive: true });
    for (const f of fs.readdirSync(model)) fs.symlinkSync(path.join('..', '..', 'blobs', `blob-${f}`), path.join(snap, f));
  }
  if (ref) {
    fs.mkdirSync(path.join(repo, 'refs'), { recursive: true });
    fs.writeFileSync(path.join(repo, 'refs', 'main'), ref);
  }
}
const arbor = (args, env) => spawnSync(ARBOR, args, { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 60000 });
const gen = ['generate', '--prompt-ids', '1,2,3', '--max-tokens', '4', '--threads', '1'];

test('generate and inspect find the snapshot refs/main names', () => {
  const cache = path.join(root, 'a');
  makeCache(cache, ['1111', '2222'], { ref: '2222' });
  const direct = arbor([...gen, '--model', model]);
  assert.equal(direct.status, 0, direct.stderr);
  const cached = arbor([...gen, '--model', 'acme/tiny-chat'], { HF_HUB_CACHE: cache });
  assert.equal(cached.status, 0, cached.stderr);
  assert.equal(cached.stdout.split('\n')[0], direct.stdout.split('\n')[0]);
  const inspect = arbor(['inspect', 'acme/tiny-chat'], { HF_HUB_CACHE: cache });
  assert.equal(inspect.status, 0, inspect.stderr);
  assert.match(inspect.stdout, /llama/);
});

test('serve names the model by its repo id; HF_HOME/hub is the cache too', async () => {
  const home = path.join(root, 'home');
  makeCache(path.join(home, 'hub'), ['abcd']);
  const s = await startServer([], { model: 'acme/tiny-chat', env: { HF_HOME: home, HF_HUB_CACHE: '' } });
  try {
    const models = await (await fetch(`${s.baseURL}/models`)).json();
    assert.equal(models.data[0].id, 'acme/tiny-chat');
    const r = await post(`${s.baseURL}/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.model, 'acme/tiny-chat');
  } finally {
    await s.stop();
  }
});

test('clear errors: not in the cache, or several snapshots and no refs/main', () => {
  const missing = arbor([...gen, '--model', 'acme/not-there'], { HF_HUB_CACHE: path.join(root, 'a') });
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /--model acme\/not-there: no such directory, and no download of it in the Hugging Face cache \(.*models--acme--not-there not found/);
  const cache = path.join(root, 'b');
  makeCache(cache, ['1111', '2222'], { ref: null });
  const ambiguous = arbor([...gen, '--model', 'acme/tiny-chat'], { HF_HUB_CACHE: cache });
  assert.equal(ambiguous.status, 1);
  assert.match(ambiguous.stderr, /has 2 snapshots and no refs\/main/);
  const one = path.join(root, 'c');
  makeCache(one, ['only'], { ref: null });
  assert.equal(arbor([...gen, '--model', 'acme/tiny-chat'], { HF_HUB_CACHE: one }).status, 0);
});
