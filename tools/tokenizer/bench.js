// npm tokenizers encode throughput over the lines of a text file, for bench/tokenizer/run.sh.
// Usage: TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 node tools/tokenizer/bench.js tokenizer.json text.txt [passes]
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [file, textFile, passesArg] = process.argv.slice(2);
  const passes = Number(passesArg || 3);
  let t = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  const loadS = Number(process.hrtime.bigint() - t) / 1e9;
  const lines = fs.readFileSync(textFile, 'utf8').split('\n').filter((l) => l.length);
  const bytes = lines.reduce((n, l) => n + Buffer.byteLength(l, 'utf8'), 0);
  // Checksum over all ids in order, the same as arbor bench-tokenizer prints (computed after timing).
  const checksum = (idLists) => {
    let c = 0;
    for (const ids of idLists) for (const id of ids) c = (Math.imul(c, 31) + id) >>> 0;
    return c.toString(16).padStart(8, '0');
  };
  const report = (what, p, idLists, s) => {
    const tokens = idLists.reduce((n, ids) => n + ids.length, 0);
    console.log(`npm    ${what} pass ${p} (${p === 1 ? 'cold cache' : 'warm cache'}): ${lines.length} lines, ` +
      `${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens (ids checksum ${checksum(idLists)}), ${s.toFixed(3)} s: ` +
      `${(bytes / 1e6 / s).toFixed(2)} MB/s, ${(tokens / s).toFixed(0)} tokens/s`);
  };
  // encode() per line, awaited one at a time: one line in flight, as a server encodes a prompt.
  for (let p = 1; p <= passes; p++) {
    const idLists = [];
    t = process.hrtime.bigint();
    for (const l of lines) idLists.push((await tok.encode(l)).getIds());
    report('encode     ', p, idLists, Number(process.hrtime.bigint() - t) / 1e9);
  }
  // encodeBatch() of all lines with parallelism off: the Rust core without per-call overhead.
  for (let p = 1; p <= passes; p++) {
    t = process.hrtime.bigint();
    const encs = await tok.encodeBatch(lines);
    const s = Number(process.hrtime.bigint() - t) / 1e9;
    report('encodeBatch', p, encs.map((e) => e.getIds()), s);
  }
  console.log(`npm    load tokenizer.json: ${loadS.toFixed(3)} s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
