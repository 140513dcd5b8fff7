// Writes the benchmark's mixed text (one input per line, ~4 MB by default, deterministic) to stdout.
// Usage: node tools/tokenizer/bench_text.js [MB] > text.txt
'use strict';
const { makeBenchLines } = require('./corpus.js');
const mb = Number(process.argv[2] || 4);
process.stdout.write(makeBenchLines(mb * 1e6).map((l) => l.replace(/\n/g, ' ')).join('\n') + '\n');
