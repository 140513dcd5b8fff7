#!/usr/bin/env bash
# On a GPU lease host (AVX-512 BF16 Xeon) from /work/main: runs binaries built on the dev VM and
# carried in build-cpugemm/ (arbor, test_model, the shared libraries that host lacks), writing logs
# to $OUT. Preparation on the dev VM (build-cpugemm/ matches main's ignored /build*/):
#   scripts/build -DARBOR_CUDA=OFF   (or cmake --build build --target arbor test_model)
#   c=/work/main/build-cpugemm; mkdir -p $c/tree $c/lib; cp build/arbor build/test_model $c/
#   git archive HEAD src tests/cpu tools/cpugemm | tar -x -C $c/tree
#   for l in pcre2-8.so.0 utf8proc.so.2 fmt.so.9 edit.so.2 tinfo.so.6 bsd.so.0 md.so.0; do
#     cp -L /lib/x86_64-linux-gnu/lib$l $c/lib/; done
# then run `build-cpugemm/tree/tools/cpugemm/device_bench.sh` with carry ["build-cpugemm"].
set -uo pipefail
c=$PWD/build-cpugemm
export LD_LIBRARY_PATH=$c/lib
# test_model reads the fixtures under the source dir compiled into it (the helper's worktree).
mkdir -p /work/wt-cpugemm && ln -sfn /work/main/tests /work/wt-cpugemm/tests
lscpu | grep -E 'Model name|L1d|L2|L3' | tee $OUT/lscpu.txt
$c/test_model --gtest_filter='CpuGemmBf16Model*:Parity.*' 2>&1 | tee $OUT/test_model.log | grep -E '^\[ (llama3|qwen3|gemma2|phi3_longrope_cross) |FAILED|PASSED|note:'
for P in 128 512 2048; do
  for mode in bf16 exact; do
    [ $mode = exact ] && [ $P != 512 ] && continue
    echo "== prompt $P --cpu-gemm $mode"
    $c/arbor bench --config bench/configs/llama-3.2-1b.json --dummy-weights --threads 2 --prompt-tokens $P \
      --chunk ${CHUNK:-512} --decode-tokens 8 --reps $([ $P = 2048 ] && echo 2 || echo 3) --cpu-gemm $mode 2>&1 | grep -v '^build\|^model\|^weights'
  done
done 2>&1 | tee $OUT/bench.log
