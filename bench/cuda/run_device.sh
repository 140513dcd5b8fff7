#!/usr/bin/env bash
# One call on the GPU machine (device tool): the CUDA tests, compute-sanitizer memcheck/racecheck on
# a short filter, and the benchmarks, with logs under $OUT. Expects the binaries built here and copied
# to .cudarun/ (arbor, test_cuda, lib/ with libfmt, libpcre2-8, libutf8proc), carried with the call:
#   run(command="bash bench/cuda/run_device.sh", carry=[".cudarun"])
# Steps can be chosen: STEPS="tests bench memcheck" (default: all, in that order), plus
#   ab: 8B batch-1 decode (--decode-only) under each setting of AB (';'-separated environment
#       assignments, "" for none; e.g. AB="ARBOR_CUDA_FUSED_PREP=0;ARBOR_CUDA_FUSED_PREP=1"), the list
#       run twice in turn, so a change is judged on one machine (H200s of the tool differ by ~1.5%);
#       a setting may also name another binary: AB="BIN=arbor_old;BIN=arbor" (both in $D); AB_ARGS adds bench
#       arguments (AB_ARGS="--decode-batch 8"), AB_CONFIG picks another config.
#   sweep: compute-sanitizer over every CUDA test, a suite per run (SWEEP_LIMIT seconds each, default
#       100): memcheck on all suites, racecheck on the kernel suites (CudaOps, CudaAttention, CudaFused,
#       CudaSampling) except the sampler tests that launch 16-block clusters over large vocabularies,
#       which racecheck does not finish (CudaSampling.RacecheckOneAndTwoBlocksPerRow covers that kernel).
#       Eleven runs: split them over calls with SWEEP_TOOLS / SWEEP_SUITES (a call has 600 s at most).
set -u
D=${ARBOR_RUN_DIR:-.cudarun}
OUT=${OUT:-/tmp/arbor-out}
mkdir -p "$OUT"
export ARBOR_SOURCE_DIR="$PWD"  # the tests' fixtures, in this copy of the tree
export LD_LIBRARY_PATH="$PWD/$D/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
STEPS=${STEPS:-"tests bench memcheck"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/gpu.txt"
summary=()
for step in $STEPS; do
  case $step in
    tests)
      timeout 150 "$D/test_cuda" > "$OUT/test_cuda.log" 2>&1
      rc=$?
      grep -E "^\[ (RUN|  FAILED|       OK|  PASSED|  SKIPPED) |Failure|error|max\|" "$OUT/test_cuda.log" | grep -v "^\[ RUN" | tail -40
      summary+=("test_cuda rc=$rc")
      ;;
    memcheck)
      filter=${MEMCHECK_FILTER:-'CudaOps.Rope*:CudaOps.Norms*:CudaOps.Activ*:CudaAttention.HeadDims*:CudaAttention.DecodeSplit*:CudaFused.QKPrep*:CudaFused.Prep*:CudaSampling.*:CudaScheduler.Sampled*:CudaAttention.PrefillLongSpans:CudaOps.TensorCore*:CudaFused.*Gemv*'}
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$D/test_cuda" --gtest_filter="$filter" > "$OUT/memcheck.log" 2>&1
      rc=$?
      tail -4 "$OUT/memcheck.log"
      summary+=("memcheck rc=$rc")
      timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 "$D/test_cuda" --gtest_filter="${RACECHECK_FILTER:-CudaAttention.HeadDims*:CudaAttention.DecodeSplit*:CudaFused.Prep*:CudaAttention.PrefillLongSpans:CudaSampling.Racecheck*}" > "$OUT/racecheck.log" 2>&1
      rc=$?
      tail -4 "$OUT/racecheck.log"
      summary+=("racecheck rc=$rc")
      ;;
    bench)
      for cfg in llama-3.1-8b qwen3-0.6b; do
        limit=240; [ "$cfg" = qwen3-0.6b ] && limit=120
        timeout $limit "$D/arbor" bench --device cuda --dummy-weights --config "bench/configs/$cfg.json" > "$OUT/bench_$cfg.log" 2>&1
        rc=$?
        tail -14 "$OUT/bench_$cfg.log"
        summary+=("bench $cfg rc=$rc")
      done
      ;;
    sweep)
      for tool in ${SWEEP_TOOLS:-memcheck racecheck}; do
        for suite in ${SWEEP_SUITES:-CudaOps CudaAttention CudaFused CudaSampling CudaScheduler CudaGenerate CudaModel}; do
          filter="$suite.*"
          if [ $tool = racecheck ]; then
            case $suite in CudaScheduler|CudaGenerate|CudaModel) continue ;; esac
            [ $suite = CudaSampling ] && filter="CudaSampling.*-CudaSampling.ClusterSize*:CudaSampling.LargeVocabulary*"
          fi
          timeout "${SWEEP_LIMIT:-100}" compute-sanitizer --tool $tool --error-exitcode 3 "$D/test_cuda" --gtest_filter="$filter" > "$OUT/sweep_${tool}_$suite.log" 2>&1
          rc=$?
          echo "sweep $tool $suite rc=$rc (124: time limit) $(grep -cE '^\[       OK' "$OUT/sweep_${tool}_$suite.log") tests ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sweep_${tool}_$suite.log" | tail -1)"
          summary+=("sweep $tool $suite rc=$rc")
        done
      done
      ;;
    ab)
      IFS=';' read -r -a settings <<< "${AB:-}"
      for round in 1 2; do
        for setting in "${settings[@]}"; do
          bin=arbor; envs=()
          for kv in $setting; do
            case $kv in BIN=*) bin=${kv#BIN=} ;; *) envs+=("$kv") ;; esac
          done
          # AB_ARGS: more bench arguments, e.g. "--decode-batch 8"; AB_CONFIG: another model config.
          env "${envs[@]}" timeout 60 "$D/$bin" bench --device cuda --dummy-weights --config "${AB_CONFIG:-bench/configs/llama-3.1-8b.json}" \
            --decode-only ${AB_ARGS:-} > "$OUT/ab.log" 2>&1
          rc=$?
          echo "ab round $round [$setting] rc=$rc $(tail -1 "$OUT/ab.log")"
        done
      done
      ;;
  esac
done
printf '%s\n' "${summary[@]}"
