// The command line's help: `arbor --help` / `-h` / `help` list the verbs, and `arbor VERB --help`
// (also `-h`, `arbor help VERB`) prints that verb's usage and flags and exits 0 without doing the
// verb's work. The binary itself checks each help text against the flags the verb accepts and names
// any difference on stderr, so a flag added without a line (or a line left after its flag went) fails here.
// Also `arbor --version`.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { ARBOR, deadline } from './lib.mjs';

deadline(60000);
const run = (...args) => spawnSync(ARBOR, args, { encoding: 'utf8', timeout: 20000 });

const top = run('--help');
const verbs = top.stdout.split('\n').filter((l) => /^  [a-z]/.test(l)).map((l) => l.trim().split(/\s+/)[0]);

test('arbor --help, -h and help list every verb', () => {
  assert.equal(top.status, 0, top.stderr);
  assert.match(top.stdout, /^usage: arbor <verb>/);
  for (const v of ['serve', 'generate', 'chat', 'bench', 'tokenize', 'detokenize', 'template', 'synth', 'inspect', 'pi'])
    assert.ok(verbs.includes(v), `${v} missing from:\n${top.stdout}`);
  for (const alt of [['-h'], ['help']]) {
    const r = run(...alt);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, top.stdout, `arbor ${alt[0]}`);
  }
});

test('every verb describes exactly the flags it accepts', () => {
  for (const v of verbs) {
    const r = run(v, '--help');
    assert.equal(r.status, 0, `arbor ${v} --help: exit ${r.status} (${r.signal ?? ''}) ${r.stderr}`);
    assert.equal(r.stderr, '', `arbor ${v} --help`);
    assert.match(r.stdout, new RegExp(`^usage: arbor ${v} `), `arbor ${v} --help`);
    assert.match(r.stdout, /\nflags:\n(  --[a-z][a-z0-9-]*.*\n(  {20,}.*\n)*)+/, `arbor ${v} --help: flag lines`);
    for (const alt of [[v, '-h'], ['help', v]]) assert.equal(run(...alt).stdout, r.stdout, `arbor ${alt.join(' ')}`);
  }
});

test('--help wins over the rest of the line, and an unknown flag points to it', () => {
  // Without --help these would load a model (or fail for lack of one); with it they only print.
  const r = run('generate', '--max-tokens', '3', '--prompt', 'hi', '-h');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^usage: arbor generate /);
  const bare = run('--port', '0', '--help');  // no verb is serve: its help, not a server on a free port
  assert.equal(bare.status, 0, bare.stderr);
  assert.match(bare.stdout, /^usage: arbor serve /);
  const bad = run('tokenize', '--bogus');
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /^arbor tokenize: arguments: unknown flag --bogus; known: .*--help describes them/);
});

test('arbor --version names the commit and the build', () => {
  const r = run('--version');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^arbor ([0-9a-f]{12}(-dirty)?|unknown commit \(not a git checkout\))\n[A-Za-z]+, .+, (no CUDA|CUDA [0-9.]+ \(.+\))\n$/);
  assert.equal(run('version').stdout, r.stdout);
});
