#!/usr/bin/env bash
# One call on the GPU machine (device tool): the CUDA tests, compute-sanitizer memcheck/racecheck on
# a short filter, and the benchmarks, with logs under $OUT. Expects the binaries built here and copied
# to .cudarun/ by bench/cuda/pack.sh (arbor, test_cuda, lib/ with the shared libraries), carried with the call:
#   run(command="bash bench/cuda/run_device.sh", carry=[".cudarun"])
# Steps can be chosen: STEPS="tests bench memcheck" (default: all, in that order), plus
#   optin: the opt-in kernels not yet checked on a GPU (affine GEMV v2/v3, CUDA trellis, tensor-core coded
#       KV decode): their tests under memcheck and each against today's default on the 8B (~9 min),
#   quant: MLX affine weights and KV codecs (issues 19 and 21): the 8B at 4-bit, the codec sweep at 4-bit
#       weights, and docs/quality.md's affine rows on CUDA (~7 min; not run yet: no device in session 14),
#   ab: 8B batch-1 decode (--decode-only) under each setting of AB (';'-separated environment
#       assignments, "" for none; e.g. AB="ARBOR_CUDA_FUSED_PREP=0;ARBOR_CUDA_FUSED_PREP=1"), the list
#       run twice in turn, so a change is judged on one machine (H200s of the tool differ by ~1.5%);
#       a setting may also name another binary: AB="BIN=arbor_old;BIN=arbor" (both in $D); AB_ARGS adds bench
#       arguments (AB_ARGS="--decode-batch 8"), AB_CONFIG picks another config; AB_ROUNDS (default 2), AB_LIMIT
#       (seconds a run, default 60). Each run's log is ab_rROUND_N.log; its tok/s lines go to the output.
#   trellis: the CudaTrellis tests under memcheck and 8B trellis decode at 1/2/4/8 rows, CUDA-core GEMV
#       against the tensor-core one (TRELLIS_BITS, TRELLIS_RUNS narrow it; ~5 min for k 2/3/4),
#   wide: the trellis GEMV tests (every kernel family and variant) and memcheck on them, then the 8B at k 2/3/4
#       (TRELLIS_BITS) over 1/8/12/16 rows with the GEMV to 16 rows (the default) against decode + cuBLASLt past 8
#       (ARBOR_CUDA_TRELLIS_GEMV_ROWS=8): is the 16-row integer kernel the faster path? (~3 min)
#   prefill: quantized prefill at the default decoded slices (128 MiB, one in flight), 16 MiB ones and two in flight (affine 4-bit, trellis 2),
#       its tests and memcheck (~5 min)
#   kvsplit: k8v3 and bf16 KV at 32@4096 and 1@32768 with 1 (auto), 2, 4 splits of the coded decode attention (~3 min)
#   narrow: the affine tensor-core GEMV at 2/3 bits: CudaAffine tests, memcheck, the 8B at 1-8 rows against v1 (~4 min)
#   optins: session 23's affine kernels (v4's integer x, v2's x ahead; defaults since session 26) against the paths before
#   v5: the affine integer tensor-core GEMV (issue 19, 2..8 rows): tests, memcheck, the 8B against the default (~4 min)
#   encoder: the GPU Viterbi's tests and its weights/s against the CPU encoder's (pack bench_trellis too),
#   tables: the issues' whole-model tables (affine 4/8/3-bit, trellis k 2/3/4, KV codec sweeps; TABLES picks parts),
#   profile: per-kernel times of one decode step under ncu (PROFILE picks the runs; ~1-3 min each),
#   sweep: compute-sanitizer over every CUDA test in one call (~460 s on an H200, estimated from its
#       parts' times; not yet run whole): memcheck on every suite, racecheck on the kernel suites
#       (CudaOps, CudaAttention, CudaFused, CudaSampling), each tool and suite its own process, four
#       groups at once. Racecheck's cost grows with the sampler's cluster (one launch of 3 rows at 16
#       blocks: 175 s beside other runs; both Racecheck* tests 78 s alone), so its sampler run keeps the
#       tests whose launches it finishes: the argmax, the per-row draws (8192 rows, one block each) and
#       the two CudaSampling.Racecheck* tests (clusters of 1, 2 and 16 blocks, a launch each); the
#       statistical and large-vocabulary tests run the same kernel at sizes it does not finish.
#       SWEEP_LIMIT: seconds a kernel-suite run may take (default 200, twice that for the model suites;
#       the sampler's racecheck gets SWEEP_SAMPLER_LIMIT, default 480); SWEEP_TOOLS / SWEEP_SUITES narrow it.
set -u
D=${ARBOR_RUN_DIR:-.cudarun}
OUT=${OUT:-/tmp/arbor-out}
mkdir -p "$OUT"
export ARBOR_SOURCE_DIR="$PWD"  # the tests' fixtures, in this copy of the tree
export LD_LIBRARY_PATH="$PWD/$D/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
STEPS=${STEPS:-"tests bench memcheck"}
for z in "$D"/*.xz; do  # pack.sh's compressed binaries
  [ -e "$z" ] || continue
  xz -dc "$z" > "${z%.xz}" && chmod +x "${z%.xz}" && rm -f "$z"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/gpu.txt"
summary=()
# Shared by the steps: a test_cuda filter run, memcheck on a filter, and one 8B decode bench; each adds a summary line.
gtests() {  # NAME LIMIT FILTER
  timeout "$2" "$D/test_cuda" --gtest_filter="$3" > "$OUT/$1.log" 2>&1
  summary+=("$1 rc=$? $(grep -cE '^\[       OK' "$OUT/$1.log") ok $(grep -cE '^\[  FAILED' "$OUT/$1.log") failed")
}
memcheck_filter() {  # NAME LIMIT FILTER
  timeout "$2" compute-sanitizer --tool memcheck --error-exitcode 3 "$D/test_cuda" --gtest_filter="$3" > "$OUT/$1.log" 2>&1
  summary+=("$1 rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/$1.log" | tail -1)")
}
bench8b() {  # NAME RUNS [ENV=VALUE ...] -- [bench arguments...]: the 8B's decode at RUNS (--decode-runs), dummy weights
  local name=$1 runs=$2 envs=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 90 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --decode-only \
    --decode-runs "$runs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $(grep -E '^ *decode b=' "$OUT/$name.log" | awk '!seen[$0]++ {print $2, $3, $4, $5, $6, $7}' | tr '\n' '|')")
}
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
      timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 "$D/test_cuda" --gtest_filter="${RACECHECK_FILTER:-CudaAttention.HeadDims*:CudaAttention.DecodeSplit*:CudaFused.Prep*:CudaAttention.PrefillLongSpans:CudaSampling.RacecheckOneAndTwo*}" > "$OUT/racecheck.log" 2>&1
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
      sweep_one() {  # tool suite: one compute-sanitizer process, its log and one summary line
        local tool=$1 suite=$2 filter="$2.*" limit=${SWEEP_LIMIT:-200} start=$SECONDS
        case $suite in CudaScheduler|CudaGenerate|CudaModel) limit=$((2 * limit)) ;; esac
        if [ $tool = racecheck ] && [ $suite = CudaSampling ]; then
          filter="CudaSampling.ArgmaxMatchesTheCpu:CudaSampling.PerRowDraws*:CudaSampling.Racecheck*"
          limit=${SWEEP_SAMPLER_LIMIT:-480}
        fi
        timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 3 "$D/test_cuda" --gtest_filter="$filter" > "$OUT/sweep_${tool}_$suite.log" 2>&1
        local rc=$?
        echo "sweep $tool $suite rc=$rc (124: past ${limit} s) in $((SECONDS - start)) s, $(grep -cE '^\[       OK' "$OUT/sweep_${tool}_$suite.log") tests ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sweep_${tool}_$suite.log" | tail -1)"
      }
      sweep_group() {  # tool suites...: one after another
        local tool=$1; shift
        case " ${SWEEP_TOOLS:-memcheck racecheck} " in *" $tool "*) ;; *) return ;; esac
        for suite in "$@"; do
          case " ${SWEEP_SUITES:-CudaOps CudaAttention CudaFused CudaSampling CudaScheduler CudaGenerate CudaModel} " in *" $suite "*) ;; *) continue ;; esac
          sweep_one $tool $suite
        done
      }
      # Four groups of about equal time, from session 10's runs of the parts (four or more processes at
      # once): memcheck on the kernel suites 127 s, on the model suites 212 s, racecheck on CudaOps +
      # CudaAttention 225 s, on CudaFused 49 s; the sampler's four racecheck tests were run apart (4 + 225 +
      # 2.5 + 78 to 175 s), so ~310-410 s is an estimate.
      sweep_group memcheck CudaOps CudaAttention CudaFused CudaSampling > "$OUT/sweep_group1.txt" &
      sweep_group memcheck CudaScheduler CudaGenerate CudaModel > "$OUT/sweep_group2.txt" &
      sweep_group racecheck CudaOps CudaAttention > "$OUT/sweep_group3.txt" &
      sweep_group racecheck CudaFused CudaSampling > "$OUT/sweep_group4.txt" &
      wait
      cat "$OUT"/sweep_group*.txt
      while read -r line; do summary+=("${line%% in *}"); done < <(cat "$OUT"/sweep_group*.txt)
      ;;
    v5)
      # Issue 19's 2..8-row decode on integer tensor cores (affine v5, ARBOR_CUDA_AFFINE_GEMV=5/6): its tests, memcheck on
      # them, then the 8B at 4-bit g64 over V5_RUNS (default 1/2/4/8 rows at ctx 512) under each setting of V5_AB
      # (';'-separated environment assignments as AB's; default: the default kernels, 6 = v5 from 2 rows, 5 = v5 at every
      # row count), twice in turn (~4 min). V5_TESTS=0 runs the benchmarks only. Logs v5_*.log.
      if [ "${V5_TESTS:-1}" = 1 ]; then
        gtests v5_tests 300 'CudaAffine.GemvV5*:CudaAffine.GemvV2*:CudaAffine.AffineCheckpoints*'
        memcheck_filter v5_memcheck 200 'CudaAffine.GemvV5*'
      fi
      IFS=';' read -r -a settings <<< "${V5_AB:-ARBOR_CUDA_AFFINE_GEMV=0;ARBOR_CUDA_AFFINE_GEMV=6;ARBOR_CUDA_AFFINE_GEMV=5}"
      for round in 1 2; do
        n=0
        for setting in "${settings[@]}"; do
          n=$((n + 1))
          bench8b "v5_r${round}_$n" "${V5_RUNS:-1@512,2@512,4@512,8@512}" $setting -- --bits 4 --group-size 64
          summary[${#summary[@]}-1]="${summary[${#summary[@]}-1]} [$setting]"
        done
      done
      ;;
    ab)
      IFS=';' read -r -a settings <<< "${AB:-}"
      for round in $(seq 1 ${AB_ROUNDS:-2}); do
        n=0
        for setting in "${settings[@]}"; do
          bin=arbor; envs=()
          for kv in $setting; do
            case $kv in BIN=*) bin=${kv#BIN=} ;; *) envs+=("$kv") ;; esac
          done
          # AB_ARGS: more bench arguments, e.g. "--decode-batch 8"; AB_CONFIG: another model config.
          n=$((n + 1)); log="$OUT/ab_r${round}_$n.log"
          env "${envs[@]}" timeout ${AB_LIMIT:-60} "$D/$bin" bench --device cuda --dummy-weights --config "${AB_CONFIG:-bench/configs/llama-3.1-8b.json}" \
            --decode-only ${AB_ARGS:-} > "$log" 2>&1
          rc=$?
          echo "ab round $round [$setting] rc=$rc $(grep -E 'tok/s' "$log" | tr -s ' ' | tr '\n' '|' | head -c 700)"
        done
      done
      ;;
    optin)
      # The opt-in kernels written without a GPU (sessions 15-16): their tests under memcheck, then each
      # against the default it would replace, in one process per setting, on the 8B config:
      # affine GEMV v1/v2/v3 (4-bit g64, b=1 and 8), CUDA trellis k=2/3/4 (b=1, 8), tensor-core coded KV
      # decode (v1 vs v2, affine8 and k8v3 at 1@8192 and 1@32768). OPTIN picks parts (default: all four).
      # Logs optin_*.log, a summary line each.
      for part in ${OPTIN:-memcheck affine trellis kvattn}; do
        case $part in
          memcheck)
            timeout ${OPTIN_MEMCHECK_LIMIT:-150} compute-sanitizer --tool memcheck --error-exitcode 3 "$D/test_cuda" \
              --gtest_filter='CudaAffine.GemvV2*:CudaTrellis.GemvMatches*:CudaKVCodec.DecodeAttentionV2*:CudaKVCodec.DecodeV2*' \
              > "$OUT/optin_memcheck.log" 2>&1
            summary+=("optin memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/optin_memcheck.log" | tail -1) $(grep -cE '^\[       OK' "$OUT/optin_memcheck.log") ok $(grep -cE '^\[  FAILED' "$OUT/optin_memcheck.log") failed")
            ;;
          affine)
            for v in 1 2 3; do
              ARBOR_CUDA_AFFINE_GEMV=$v timeout 90 "$D/arbor" bench --device cuda --dummy-weights --bits 4 --group-size 64 \
                --config bench/configs/llama-3.1-8b.json --decode-only --decode-runs 1@512,8@512 > "$OUT/optin_affine_v$v.log" 2>&1
              summary+=("optin affine gemv v$v rc=$? $(grep -E 'tok/s' "$OUT/optin_affine_v$v.log" | tr '\n' '|' | head -c 400)")
            done
            ;;
          trellis)
            for k in ${OPTIN_TRELLIS_BITS:-2 3 4}; do
              timeout 90 "$D/arbor" bench --device cuda --dummy-weights --format trellis --bits $k \
                --config bench/configs/llama-3.1-8b.json --decode-only --decode-runs 1@512,8@512 > "$OUT/optin_trellis_k$k.log" 2>&1
              summary+=("optin trellis k=$k rc=$? $(grep -E 'tok/s' "$OUT/optin_trellis_k$k.log" | tr '\n' '|' | head -c 400)")
            done
            ;;
          kvattn)
            for v in v1 v2; do
              ARBOR_CUDA_KV_ATTN=$v timeout 120 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json \
                --decode-only --decode-tokens 32 --decode-runs 1@8192,1@32768 --kv-sweep bf16/affine8/k8v3 > "$OUT/optin_kvattn_$v.log" 2>&1
              summary+=("optin kv attention $v rc=$? $(grep -E 'tok/s' "$OUT/optin_kvattn_$v.log" | tr '\n' '|' | head -c 600)")
            done
            ;;
        esac
      done
      ;;
    trellis)
      # Issue 20's CUDA GEMVs: the CudaTrellis tests under memcheck, then 8B decode with trellis linears at
      # 1/2/4/8 rows for each TRELLIS_BITS (default 2 3 4), the FP32 kernels (ARBOR_CUDA_TRELLIS_MMA=0) against
      # the integer tensor-core ones (=1, the default), one process per setting ("auto": the variable unset).
      # Logs trellis_*.log, a summary line each.
      timeout ${TRELLIS_MEMCHECK_LIMIT:-200} compute-sanitizer --tool memcheck --error-exitcode 3 "$D/test_cuda" \
        --gtest_filter='CudaTrellis.*' > "$OUT/trellis_memcheck.log" 2>&1
      summary+=("trellis memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/trellis_memcheck.log" | tail -1) $(grep -cE '^\[       OK' "$OUT/trellis_memcheck.log") ok $(grep -cE '^\[  FAILED' "$OUT/trellis_memcheck.log") failed")
      for k in ${TRELLIS_BITS:-2 3 4}; do
        for mma in ${TRELLIS_MMA:-0 1}; do  # "auto": the variable unset (the default choice by rows)
          env $([ "$mma" = auto ] && echo -u ARBOR_CUDA_TRELLIS_MMA || echo ARBOR_CUDA_TRELLIS_MMA=$mma) timeout 90 "$D/arbor" bench --device cuda --dummy-weights --format trellis --bits $k \
            --config bench/configs/llama-3.1-8b.json --decode-only --decode-runs ${TRELLIS_RUNS:-1@512,2@512,4@512,8@512} \
            > "$OUT/trellis_k${k}_mma$mma.log" 2>&1
          summary+=("trellis k=$k mma=$mma rc=$? $(grep -E 'tok/s' "$OUT/trellis_k${k}_mma$mma.log" | tr '\n' '|' | head -c 600)")
        done
      done
      ;;
    profile)
      # Where a decode step's time goes, per kernel: Nsight Compute's gpu__time_duration over a short
      # --decode-only bench (kernels serialised, each timed alone), summarised for one step by
      # kernel_times.py. PROFILE: ';'-separated NAME:bench-arguments (default: the 8B at 4-bit g64 b=1,
      # trellis k=2 at b=1 and b=8). Logs profile_NAME.csv / .txt.
      IFS=';' read -r -a profs <<< "${PROFILE:-q4b1:--bits 4 --group-size 64 --decode-runs 1@512;tr2b1:--format trellis --bits 2 --decode-runs 1@512;tr2b8:--format trellis --bits 2 --decode-runs 8@512}"
      for spec in "${profs[@]}"; do
        n=${spec%%:*}
        timeout ${PROFILE_LIMIT:-200} ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/profile_$n.csv" \
          "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --decode-only --decode-tokens 3 --reps 1 \
          ${spec#*:} > "$OUT/profile_${n}_bench.log" 2>&1
        rc=$?
        for f in ${PROFILE_FORWARD:-4 3 2}; do  # the last decode step there is (forward 1: the context's prefill)
          python3 bench/cuda/kernel_times.py "$OUT/profile_$n.csv" --forward $f > "$OUT/profile_$n.txt" 2>&1 && break
        done
        summary+=("profile $n rc=$rc $(head -c 1500 "$OUT/profile_$n.txt")")
      done
      ;;
    detail)
      # Why a kernel runs at the rate it does: Nsight Compute on the first launches matching DETAIL_KERNELS
      # (a regex) in a short 8B decode, per DETAIL spec (';'-separated NAME:ENV:bench-arguments, ENV a
      # space-free assignment or "-"): issue-slot and per-pipe utilisation, achieved occupancy, registers,
      # warp stall reasons per issued instruction, instructions and DRAM bytes. Logs detail_NAME.txt.
      # DETAIL_MEM=1 adds a second ncu pass per spec (detail_NAME_mem.txt): L1/L2 throughput, global load
      # requests and sectors, shared-memory wavefronts and bank conflicts.
      IFS=';' read -r -a specs <<< "${DETAIL:-tr2b1:-:--format trellis --bits 2 --decode-runs 1@512;tr2b8:-:--format trellis --bits 2 --decode-runs 8@512}"
      m="gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,smsp__warp_issue_stalled_not_selected_per_warp_active.pct,smsp__warp_issue_stalled_selected_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_no_instruction_per_warp_active.pct,smsp__warp_issue_stalled_dispatch_stall_per_warp_active.pct,smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct,smsp__warp_issue_stalled_drain_per_warp_active.pct,smsp__warp_issue_stalled_imc_miss_per_warp_active.pct,smsp__warp_issue_stalled_misc_per_warp_active.pct,smsp__warp_issue_stalled_tex_throttle_per_warp_active.pct,smsp__warp_issue_stalled_sleeping_per_warp_active.pct,smsp__warp_issue_stalled_membar_per_warp_active.pct"
      for spec in "${specs[@]}"; do
        n=${spec%%:*}; rest=${spec#*:}; e=${rest%%:*}; args=${rest#*:}
        envs=(); [ "$e" != "-" ] && envs=("$e")
        env "${envs[@]}" timeout ${DETAIL_LIMIT:-150} ncu --clock-control none --kernel-name "regex:${DETAIL_KERNELS:-trellis_(gemv|mma|imma)}" \
          --launch-count ${DETAIL_COUNT:-8} --metrics "$m" \
          "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --decode-only --decode-tokens 2 --reps 1 \
          $args > "$OUT/detail_$n.txt" 2>&1
        summary+=("detail $n rc=$? $(grep -c "==PROF== Profiling" "$OUT/detail_$n.txt") kernels")
        if [ "${DETAIL_MEM:-0}" = 1 ]; then  # the memory side, its own pass (a metric this ncu lacks fails only this one)
          mm="gpu__time_duration.sum,dram__bytes_read.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_global_ld.sum,smsp__inst_executed_op_shared_ld.sum"
          env "${envs[@]}" timeout ${DETAIL_LIMIT:-150} ncu --clock-control none --kernel-name "regex:${DETAIL_KERNELS:-trellis_(gemv|mma|imma)}" \
            --launch-count ${DETAIL_COUNT:-8} --metrics "$mm" \
            "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --decode-only --decode-tokens 2 --reps 1 \
            $args > "$OUT/detail_${n}_mem.txt" 2>&1
          summary+=("detail $n memory rc=$? $(grep -c "==PROF== Profiling" "$OUT/detail_${n}_mem.txt") kernels")
        fi
      done
      ;;
    wide)
      gtests wide_tests 150 'CudaTrellis*:TrellisCuda*'
      memcheck_filter wide_memcheck 200 'CudaTrellis.*'
      for k in ${TRELLIS_BITS:-2 3 4}; do
        for rows in 16 8; do
          bench8b wide_k${k}_gemv$rows 1@512,8@512,12@512,16@512 ARBOR_CUDA_TRELLIS_GEMV_ROWS=$rows -- --format trellis --bits $k
        done
      done
      ;;
    narrow)
      # Issue 19: the tensor-core GEMV for 2- and 3-bit codes (v2's chunked widths): its tests and memcheck on them,
      # then the 8B at 2/3-bit g64 (NARROW_BITS) at 1/2/4/8 rows with the defaults against v1 everywhere
      # (ARBOR_CUDA_AFFINE_GEMV=1, the kernel these widths ran before). Logs narrow_*.log.
      gtests narrow_tests 200 'CudaAffine.*'
      memcheck_filter narrow_memcheck 250 'CudaAffine.GemvV2*:CudaAffine.Fused*'
      for b in ${NARROW_BITS:-3 2}; do
        for v in 0 1; do bench8b narrow_b${b}_v$v 1@512,2@512,4@512,8@512 ARBOR_CUDA_AFFINE_GEMV=$v -- --bits $b --group-size 64; done
      done
      ;;
    optins)
      # Session 23's affine opt-ins, the defaults since session 26 (H100, two rounds), against the paths before them in the
      # same call, the 4-bit 8B at 1/3/8 rows, twice: v4 with x as 16-bit integers and __dp4a (ARBOR_CUDA_AFFINE_STREAM_INT=1
      # against 0), v2 with x loaded 1 or 2 pieces ahead (ARBOR_CUDA_AFFINE_V2_XPF; 0 is the path before). Their tests first, memcheck last. (Session 24's
      # other items were decided by its run: trellis 16-warp CTAs and 5/6-bit v2 are defaults, the new dequant kernel was
      # slower and was dropped; docs/benchmarks.md.) Log names carry no '=' (the device tool does not return such files).
      gtests optins_tests 150 'CudaAffine.GemvV2*:CudaAffine.GemvStream*:CudaAffineGemm.Dequant*:CudaAffineLinear.*:CudaTrellis.Gemv*'
      for r in 1 2; do
        for v in STREAM_INT=0 STREAM_INT=1 V2_XPF=0 V2_XPF=2; do
          n=$(echo "$v" | tr 'A-Z=' 'a-z_')
          bench8b optins_a4_${n}_r$r 1@512,3@512,8@512 ARBOR_CUDA_AFFINE_$v -- --bits 4 --group-size 64
        done
      done
      memcheck_filter optins_memcheck 250 'CudaAffine.GemvV2*:CudaAffine.GemvStream*:CudaAffineGemm.Dequant*:CudaTrellis.Gemv*'
      ;;
    prefill)
      # Quantized prefill (decoded slices + cuBLASLt): the default (128 MiB slices, one in flight; session 26) against
      # 16 MiB slices (the default before) and two slices in flight (ARBOR_CUDA_DQ_STREAMS=2, opt-in), 8B at 4-bit g64 and
      # trellis k=2, prefill 512/2048/8192, twice in turn. The decoded-slice tests first (both stream counts), memcheck on them.
      gtests prefill_tests 120 'CudaAffineLinear.*:CudaTrellis.Prefill*:CudaTrellis.PickLinear*'
      for r in 1 2; do
        for v in "DQ_STREAMS=1" "DQ_SLICE_MIB=16" "DQ_STREAMS=2"; do
          n=$(echo "$v" | tr 'A-Z= ' 'a-z__')
          for f in "a4:--bits 4 --group-size 64" "t2:--format trellis --bits 2"; do
            env ARBOR_CUDA_$v timeout 120 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json \
              --prefill-only 512,2048,8192 ${f#*:} > "$OUT/prefill_${f%%:*}_${n}_r$r.log" 2>&1
            summary+=("prefill ${f%%:*} $v r$r rc=$? $(grep -E '^ *prefill [0-9]' "$OUT/prefill_${f%%:*}_${n}_r$r.log" | tail -3 | awk '{print $2, $3, $5}' | tr '\n' '|')")
          done
        done
      done
      memcheck_filter prefill_memcheck 200 'CudaAffineLinear.*:CudaTrellis.Prefill*'
      ;;
    kvsplit)
      # Issue 21's batch-32 point (k8v3 1.52x bf16 at 32@4096, target 1.6x): the tensor-core coded decode runs one split a
      # (kv head, sequence) there (2 blocks an SM x 132 SMs >= 256 blocks); more splits (ARBOR_CUDA_KV_MMA_SPLITS=2/4) for
      # shorter serial walks, twice in turn, bf16 weights.
      for r in 1 2; do
        for v in 0 2 4; do
          bench8b kvsplit_s${v}_r$r 32@4096,1@32768 ARBOR_CUDA_KV_MMA_SPLITS=$v -- --decode-tokens 32 --kv-sweep k8v3/bf16
        done
      done
      ;;
    encoder)
      # Issue 20's GPU Viterbi: its tests (the paths state for state against the CPU encoder), then weights/s of
      # the whole encode (scales, targets and packing on the host's threads) on a [4096 x 4096] Gaussian matrix
      # (16.8M weights), k 2/3/4, its words checked against the CPU's. Needs bench_trellis in $D:
      # `bash bench/cuda/pack.sh bench_trellis`. Logs encoder_*.log.
      gtests encoder_test 120 'CudaTrellisEncode.*'
      timeout ${ENCODER_LIMIT:-300} "$D/bench_trellis" --rows ${ENCODER_ROWS:-4096} --cols 4096 --reps 2 --threads 16 --isa avx512,cuda > "$OUT/encoder_bench.log" 2>&1
      summary+=("encoder bench rc=$? $(grep -h 'k=' "$OUT/encoder_bench.log" | tr '\n' '|' | head -c 900)")
      ;;
    tables)
      # The issues' whole-model tables with today's kernels, each part one process with its own ceilings, a compact
      # summary line each (logs tables_NAME.log). TABLES picks parts (default all; ~12 min in all, so two calls: e.g.
      # TABLES="a4 a8 a3" then TABLES="t2 t3 t4 kv4 kv16"):
      #   aB   issue 19: MLX affine B-bit g64, every bench figure (decode 1/2/4/8/32/64 rows, ctx 512 and 8192; prefill)
      #   tK   issue 20: trellis k, decode 1@512 and 8@512, then prefill 2048 (a second process)
      #   kv4  issue 21: the codec sweep at 4-bit weights, 1@8192, 1@32768, 32@4096;  kv16: the same at bf16 weights
      for part in ${TABLES:-a4 a8 a3 t2 t3 t4 kv4 kv16}; do
        log="$OUT/tables_$part.log"
        case $part in
          a[2-8]) timeout 240 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --bits ${part#a} \
                    --group-size 64 > "$log" 2>&1 ;;
          t[234]) timeout 90 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --format trellis \
                    --bits ${part#t} --decode-only --decode-runs 1@512,8@512 > "$log" 2>&1
                  timeout 90 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json --format trellis \
                    --bits ${part#t} --prefill-only 2048 >> "$log" 2>&1 ;;
          kv4|kv16) timeout 200 "$D/arbor" bench --device cuda --dummy-weights --config bench/configs/llama-3.1-8b.json \
                    $([ $part = kv4 ] && echo --bits 4 --group-size 64) --decode-only --decode-tokens 32 \
                    --decode-runs 1@8192,1@32768,32@4096 --kv-sweep bf16/affine8/affine4/k8v4/k8v3 > "$log" 2>&1 ;;
          *) echo "tables: unknown part $part" > "$log"; false ;;
        esac
        summary+=("tables $part rc=$? $(grep -E 'ceilings|^ *(decode|prefill) ' "$log" | sed -E 's/.*copy ([0-9.]+ GB.s).*GEMM [^ ]+ ([0-9.]+ TFLOP.s).*/ceilings \1 \2/' |
          awk '{$1 = $1; line = $1 == "ceilings" ? $0 : $1 " " $2 " " $3 " " $4 " " $5 " " $6} !seen[line]++ {print line}' | tr '\n' '|')")
      done
      ;;
    quant)
      # Issue 19 / 21: the 8B at MLX affine 4-bit g64 (every bench figure), the KV codec sweep at 4-bit weights,
      # and the quality rows of docs/quality.md on CUDA (the evaluation model quantized here by arbor quantize,
      # its bf16 run the KL base). Logs quant_*.log; each a line of the summary.
      Q=/tmp/arbor-quality; mkdir -p $Q; EM=tests/fixtures/eval-model
      timeout 200 "$D/arbor" bench --device cuda --dummy-weights --bits 4 --group-size 64 --config bench/configs/llama-3.1-8b.json \
        > "$OUT/quant_bench_8b_q4.log" 2>&1
      summary+=("quant bench 8B 4-bit rc=$?")
      timeout 150 "$D/arbor" bench --device cuda --dummy-weights --bits 4 --group-size 64 --config bench/configs/llama-3.1-8b.json \
        --decode-only --decode-tokens 32 --decode-runs 1@8192,1@32768,32@4096 --kv-sweep bf16/affine8/affine4/k8v4/k8v3 \
        > "$OUT/quant_kv_sweep_q4.log" 2>&1
      summary+=("quant kv sweep at 4-bit weights rc=$?")
      timeout 60 "$D/arbor" perplexity --model $EM --file $EM/heldout.txt --ctx 1024 --device cuda --json --save-logits $Q/base.ppl \
        > "$OUT/quant_ppl_base.log" 2>&1
      for spec in "a8:--bits 8" "a6:--bits 6" "a4:--bits 4" "a3:--bits 3" "a2:--bits 2" "m36:--recipe mixed_3_6"; do
        n=${spec%%:*}
        timeout 60 "$D/arbor" quantize --model $EM --out $Q/$n ${spec#*:} --group-size 64 > "$OUT/quant_make_$n.log" 2>&1
        timeout 60 "$D/arbor" perplexity --model $Q/$n --file $EM/heldout.txt --ctx 1024 --device cuda --json --kl-base $Q/base.ppl \
          > "$OUT/quant_ppl_$n.log" 2>&1
        summary+=("quant quality $n rc=$? $(tail -1 "$OUT/quant_ppl_$n.log" | head -c 200)")
      done
      ;;
  esac
done
printf '%s\n' "${summary[@]}"
