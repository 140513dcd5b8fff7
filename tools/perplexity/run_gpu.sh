#!/usr/bin/env bash
# `arbor perplexity` on the GPU machine: the evaluation model on its held-out text at ctx 1024 on CUDA
# and on the CPU, each saving its top-K distributions, then each against the other (KL CPU vs CUDA), and
# CUDA at ctx 128 / 512 beside transformers' figures (tests/fixtures/perplexity/eval_reference.json).
# Expects the binaries packed by bench/cuda/pack.sh (built here with nvcc), carried with the call:
#   bash bench/cuda/pack.sh
#   run(command="bash tools/perplexity/run_gpu.sh", carry=[".cudarun"])
# Writes under $OUT: *.json (one `--json` object each), run.log.
set -u
D=${ARBOR_RUN_DIR:-.cudarun}
OUT=${OUT:-/tmp/arbor-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
A="$D/arbor"
M=tests/fixtures/eval-model
F=$M/heldout.txt
T=$(mktemp -d)
run() {  # name, args...
  local name=$1
  shift
  echo "== $name: arbor perplexity $*" | tee -a "$OUT/run.log"
  "$A" perplexity --model "$M" --file "$F" --json "$@" 2>>"$OUT/run.log" | tail -1 | tee "$OUT/$name.json" | tee -a "$OUT/run.log"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$OUT/run.log" 2>&1
run cuda_1024 --ctx 1024 --device cuda --save-logits "$T/cuda.ppl"
run cpu_1024 --ctx 1024 --device cpu --save-logits "$T/cpu.ppl"
run cuda_vs_cpu_1024 --ctx 1024 --device cuda --kl-base "$T/cpu.ppl"
run cpu_vs_cuda_1024 --ctx 1024 --device cpu --kl-base "$T/cuda.ppl"
run cuda_512 --ctx 512 --device cuda
run cuda_128 --ctx 128 --device cuda
rm -rf "$T"
