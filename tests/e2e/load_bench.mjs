// Load driver and server-overhead benchmark (prints numbers; not a CTest test).
//   node tests/e2e/load_bench.mjs [--clients 1,4,8] [--requests 4] [--max-tokens 32] [--prompt-tokens 64]
//        [--model DIR | --config FILE --tokenizer DIR] [--threads 1] [--device cpu|cuda] [--overhead]
// Starts `arbor serve` (ARBOR_BIN) on a free port, runs N concurrent streaming clients (each sends
// --requests requests back to back, raw fetch + SSE parsing), and reports throughput, TTFT p50/p99,
// inter-token latency p50/p99, failures and the server's RSS before and after. --overhead compares one
// streaming request's decode rate and TTFT with `arbor generate` on the same model and prompt.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { ARBOR, startServer, testModel, metrics as metricsOf } from './lib.mjs';

const argv = process.argv.slice(2);
const opt = (name, def) => { const i = argv.indexOf(`--${name}`); return i >= 0 ? argv[i + 1] : def; };
const clients = opt('clients', '1,4,8').split(',').map(Number);
const perClient = Number(opt('requests', '4'));
const maxTokens = Number(opt('max-tokens', '32'));
const temperature = Number(opt('temperature', '1.0'));
const promptTokens = Number(opt('prompt-tokens', '64'));
const threads = opt('threads', '1');
const device = opt('device', 'cpu');
const config = opt('config', null);
const model = config ? null : opt('model', null) ?? testModel();
const genArgs = [...(config ? ['--config', config, '--dummy-weights'] : ['--model', model]), '--device', device];  // what `arbor generate` takes
const modelArgs = config ? [...genArgs, '--tokenizer', opt('tokenizer', null) ?? testModel()] : genArgs;

const pct = (xs, p) => { if (!xs.length) return NaN; const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]; };
const rss = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
const promptVocab = Number(opt("prompt-vocab", "8000"));  // prompt ids are drawn below this
const prompt = Array.from({ length: promptTokens }, (_, i) => 100 + ((i * 7919) % (promptVocab - 100)));

// One streaming completion (`extra` overrides body fields); returns {ttft, itl[], tokens, first, last}: times
// in ms, first/last the arrival of the first and last content chunk, tokens from the usage chunk.
async function one(baseURL, seed, extra = {}) {
  const t0 = performance.now();
  const r = await fetch(`${baseURL}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature, seed, stream: true, stream_options: { include_usage: true }, ...extra }) });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', first = null, last = null, tokens = 0;
  const itl = [];
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const d = JSON.parse(ev.slice(6));
      if (d.error) throw new Error(JSON.stringify(d.error));
      if (d.usage) tokens = d.usage.completion_tokens;
      if (d.choices?.[0]?.text) {
        const now = performance.now();
        if (first === null) first = now; else itl.push(now - last);
        last = now;
      }
    }
  }
  return { ttft: first - t0, itl, tokens, first, last };
}

async function load(server, n) {
  const ttft = [], itl = [];
  let failures = 0, tokens = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: n }, async (_, c) => {
    for (let k = 0; k < perClient; k++) {
      try {
        const r = await one(server.baseURL, c * 1000 + k);
        ttft.push(r.ttft); itl.push(...r.itl); tokens += r.tokens;
      } catch (e) { failures++; console.error(`client ${c}: ${e.message}`); }
    }
  }));
  const secs = (performance.now() - t0) / 1000;
  return { clients: n, requests: n * perClient, tokens, seconds: +secs.toFixed(2), tok_per_s: +(tokens / secs).toFixed(1),
    ttft_p50_ms: +pct(ttft, 50).toFixed(1), ttft_p99_ms: +pct(ttft, 99).toFixed(1), itl_p50_ms: +pct(itl, 50).toFixed(2),
    itl_p99_ms: +pct(itl, 99).toFixed(2), failures };
}

const maxBatch = Math.max(...clients);
const server = await startServer([...(config ? modelArgs : []), '--device', device, '--max-batch', String(maxBatch), '--threads', threads, '--max-queue', '256'],
  { model: config ? null : model });
console.log(`machine: ${fs.readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*:\s*(.*)/)[1]}, ${(await import('node:os')).cpus().length} cpus`);
console.log(`model: ${config ?? model} on ${device}; prompt ${promptTokens} tokens, max_tokens ${maxTokens}, temperature ${temperature}, ${perClient} requests per client, --threads ${threads}`);
await one(server.baseURL, 1);  // warm-up
const rss0 = rss(server.proc.pid);
for (const n of clients) console.log(JSON.stringify({ ...(await load(server, n)), server_rss_mib: +rss(server.proc.pid).toFixed(1) }));
const rss1 = rss(server.proc.pid);
console.log(`server RSS: ${rss0.toFixed(1)} MiB before, ${rss1.toFixed(1)} MiB after`);

if (argv.includes('--overhead')) {
  // Same prompt, greedy, one request: HTTP stream vs arbor generate (best of 3 each). The decode rate is
  // (completion tokens - 1) over the time from the first to the last content chunk, the token count from
  // the usage chunk (no logprobs: they would add work generate does not do).
  let best = null;
  for (let i = 0; i < 3; i++) {
    const r = await one(server.baseURL, 0, { temperature: 0, ignore_eos: true });
    const decode = (r.tokens - 1) / ((r.last - r.first) / 1000);
    if (!best || decode > best.decode) best = { ttft: r.ttft, decode, n: r.tokens };
  }
  // TTFT (first text chunk) at the run's temperature, and the bare HTTP round trip of this client for scale.
  let ttft = Infinity, rtt = Infinity, clientSum = 0;
  const m0 = await metricsOf(server.url);
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    await (await fetch(`${server.url}/health`)).text();
    rtt = Math.min(rtt, performance.now() - t0);
    const r = await one(server.baseURL, 7).catch(() => null);
    if (r) ttft = Math.min(ttft, r.ttft), clientSum += r.ttft;
  }
  // The engine's own TTFT (submit -> first token) for the same 5 requests, from /metrics: the difference
  // to what the client sees is what HTTP, JSON and SSE add.
  const m1 = await metricsOf(server.url);
  const key = 'arbor_time_to_first_token_seconds';
  const engineMs = (1000 * (m1[`${key}_sum`] - m0[`${key}_sum`])) / (m1[`${key}_count`] - m0[`${key}_count`]);
  console.log(`TTFT over HTTP (mean of 5): client ${(clientSum / 5).toFixed(2)} ms, engine ${engineMs.toFixed(2)} ms, ` +
    `added by the server's HTTP path + client: ${(clientSum / 5 - engineMs).toFixed(2)} ms`);
  best.ttft = Math.min(best.ttft, ttft);
  let gen = null;
  for (let i = 0; i < 3; i++) {
    const out = execFileSync(ARBOR, ['generate', ...genArgs, '--threads', threads, '--prompt-ids', prompt.join(','), '--max-tokens', String(maxTokens)],
      { encoding: 'utf8' });
    const m = out.match(/prefill: (\d+) tokens, ([\d.]+) tok\/s; decode: (\d+) tokens, ([\d.]+) tok\/s/);
    const g = { prefill_ms: (Number(m[1]) / Number(m[2])) * 1000, decode: Number(m[4]), steps: Number(m[3]) };
    if (!gen || g.decode > gen.decode) gen = g;
  }
  if (gen.steps + 1 < maxTokens) console.log(`note: generate stopped at an EOS after ${gen.steps + 1} tokens; rates cover different lengths`);
  console.log(`overhead: HTTP stream decode ${best.decode.toFixed(1)} tok/s vs generate ${gen.decode.toFixed(1)} tok/s ` +
    `(${((100 * best.decode) / gen.decode).toFixed(1)}%); TTFT ${best.ttft.toFixed(2)} ms vs generate prefill ${gen.prefill_ms.toFixed(2)} ms ` +
    `(+${(best.ttft - gen.prefill_ms).toFixed(2)} ms; this client's bare /health round trip: ${rtt.toFixed(2)} ms)`);
}
await server.stop();
