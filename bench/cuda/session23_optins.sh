#!/usr/bin/env bash
# Session 23's three opt-in kernels, checked and measured in one device call (binaries from bash bench/cuda/pack.sh):
#   run(command="bash bench/cuda/session23_optins.sh", carry=[".cudarun"])
# tests of the affine and trellis GEMVs (every variant through the tests' setters), memcheck on them, then the 8B at
# 4-bit g64 with x as integers in v4 (ARBOR_CUDA_AFFINE_STREAM_INT) and x loaded ahead in v2 (ARBOR_CUDA_AFFINE_V2_XPF),
# and the trellis k = 2 at 8-16 rows with 16-warp CTAs (ARBOR_CUDA_TRELLIS_W16). Logs under $OUT.
D=${ARBOR_RUN_DIR:-.cudarun}; O=${OUT:-/tmp/arbor-out}; mkdir -p $O; export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64; export ARBOR_SOURCE_DIR=$PWD
for z in $D/*.xz; do xz -dc $z > ${z%.xz}; chmod +x ${z%.xz}; done
timeout 150 $D/test_cuda --gtest_filter='CudaAffine.*:CudaTrellis*:TrellisCuda*' > $O/t.log 2>&1; echo "tests rc=$? $(grep -c '^\[       OK' $O/t.log) ok $(grep -c '^\[  FAILED' $O/t.log) failed"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $D/test_cuda --gtest_filter='CudaAffine.GemvV2*:CudaAffine.GemvStream*:CudaTrellis.Gemv*' > $O/m.log 2>&1; echo "memcheck rc=$? $(grep 'ERROR SUMMARY' $O/m.log|tail -1)"
for s in 0_0 1_0 0_1 0_2 0_0 1_0; do i=${s%_*}; x=${s#*_}
ARBOR_CUDA_AFFINE_STREAM_INT=$i ARBOR_CUDA_AFFINE_V2_XPF=$x timeout 70 $D/arbor bench --device cuda --dummy-weights --bits 4 --group-size 64 --config bench/configs/llama-3.1-8b.json --decode-only --decode-runs 1@512,3@512,8@512 > $O/b_${s}_$RANDOM.log 2>&1
echo "int $i xpf $x: $(ls -t $O/b_*.log | head -1 | xargs grep -E '^ *decode b=|ceilings' | head -4 | awk '{print $2,$3,$4}' | tr '\n' ' ')"
done
for w in 0 1 0 1; do ARBOR_CUDA_TRELLIS_W16=$w timeout 70 $D/arbor bench --device cuda --dummy-weights --format trellis --bits 2 --config bench/configs/llama-3.1-8b.json --decode-only --decode-runs 8@512,12@512,16@512 > $O/tw${w}_$RANDOM.log 2>&1
echo "trellis w16 $w: $(ls -t $O/tw*.log | head -1 | xargs grep -E '^ *decode b=' | head -3 | awk '{print $2,$4}' | tr '\n' ' ')"; done
