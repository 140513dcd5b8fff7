// pi coding agent against a real server: `arbor pi` writes the provider entry (keeping other providers),
// `PI_OFFLINE=1 pi -p --no-session --model arbor/local "…"` completes, `arbor pi --remove` takes it out.
import test from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ARBOR, SRC, startServer, deadline, metrics } from './lib.mjs';

deadline(150000);
// A context large enough that pi does not compact (summarise) the conversation after one turn.
const server = await startServer(['--ctx-size', '32768', '--max-batch', '2']);
const agentDir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-pi-'));
const env = { ...process.env, PI_CODING_AGENT_DIR: agentDir, PI_OFFLINE: '1', PI_SKIP_VERSION_CHECK: '1' };
test.after(async () => { await server.stop(); fs.rmSync(agentDir, { recursive: true, force: true }); });

test('arbor pi writes the provider; pi completes a prompt; --remove removes it', async () => {
  const other = { baseUrl: 'http://example.invalid/v1', api: 'openai-completions', apiKey: 'k', models: [{ id: 'm' }] };
  fs.writeFileSync(path.join(agentDir, 'models.json'), JSON.stringify({ providers: { other } }));
  // A small maxTokens keeps the random-weight model's answer short.
  execFileSync(ARBOR, ['pi', '--port', String(server.port), '--max-tokens', '8'], { env });
  const doc = JSON.parse(fs.readFileSync(path.join(agentDir, 'models.json'), 'utf8'));
  assert.deepEqual(doc.providers.other, other);
  const p = doc.providers.arbor;
  assert.equal(p.baseUrl, `${server.baseURL}`);
  assert.equal(p.api, 'openai-completions');
  const m = p.models[0];
  assert.equal(m.id, 'local');
  assert.equal(m.name, 'qwen3-tiny');
  assert.equal(m.contextWindow, 32768);
  assert.equal(m.maxTokens, 8);
  assert.deepEqual(m.input, ['text']);
  assert.equal(m.reasoning, true);
  assert.equal(m.compat.supportsDeveloperRole, false);
  assert.equal(m.compat.thinkingFormat, 'qwen-chat-template');

  const before = await metrics(server.url);
  const pi = path.join(SRC, 'node_modules', '.bin', 'pi');
  const r = await new Promise((resolve) => {
    const c = spawn(pi, ['-p', '--no-session', '--model', 'arbor/local', 'Say hello.'], { env, cwd: agentDir, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    c.stdout.on('data', (d) => (stdout += d));
    c.stderr.on('data', (d) => (stderr += d));
    const t = setTimeout(() => c.kill('SIGKILL'), 90000);
    c.on('exit', (status) => { clearTimeout(t); resolve({ status, stdout, stderr }); });
  });
  assert.equal(r.status, 0, `pi failed: ${r.stderr}\n${r.stdout}`);
  const after = await metrics(server.url);
  const key = 'arbor_http_requests_total{route="/v1/chat/completions",status="200"}';
  assert.ok((after[key] ?? 0) > (before[key] ?? 0), 'pi did not reach the server');
  assert.ok(after.arbor_prompt_tokens_total - before.arbor_prompt_tokens_total > 300, 'pi system prompt and tools expected');
  assert.ok(r.stdout.trim().length > 0, 'pi printed nothing');

  execFileSync(ARBOR, ['pi', '--remove'], { env });
  const doc2 = JSON.parse(fs.readFileSync(path.join(agentDir, 'models.json'), 'utf8'));
  assert.deepEqual(doc2.providers, { other });
});
