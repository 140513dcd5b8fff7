#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, CPU only, for the GPU lease host's Xeon (AVX-512 F/BW/DQ/VL + VBMI +
# VNNI + BF16, Sapphire Rapids class) on a machine that lacks those instructions (the dev VM, Zen 1).
# Usage: tools/cpugemm/build_llamacpp.sh SRC [BUILD]   (SRC: llama.cpp source tree, e.g. from
#   git --git-dir=/work/.mirror/ggerganov+llama.cpp/repo archive --format=tar HEAD -- . ':(exclude)models' | tar -x -C SRC)
# Result: BUILD/bin/llama-bench, linked statically against libllama/libggml (BUILD_SHARED_LIBS=OFF);
# it needs only glibc, libstdc++, libgcc_s and libgomp (OpenMP, ggml's default threading) at run time.
#
# Why explicit flags and not the run-time variant choice: GGML_CPU_ALL_VARIANTS (with GGML_BACKEND_DL)
# compiles ggml-cpu once per x86 level (sandybridge ... sapphirerapids) and loads the best at run time,
# which is the fair default but costs ~6 ggml-cpu compiles on a shared 2-core VM. GGML_NATIVE=OFF with
# the AVX512* options gives the same code paths that matter for a bf16 model: the llamafile sgemm
# (tinyBLAS) bf16 x bf16 path and ggml_vec_dot_bf16, both under __AVX512BF16__. AMX is left off: in
# this llama.cpp the AMX kernels cover only quantized types (Q4_0 ... IQ4_XS; amx/common.h), not bf16.
set -euo pipefail
src=${1:?usage: build_llamacpp.sh SRC [BUILD]}
bld=${2:-$src/build-xeon}
cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON \
  -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
nice cmake --build "$bld" -j2 --target llama-bench
# The flags the CPU code was compiled with (check them against the target's /proc/cpuinfo).
grep -o -- '-m[a-z0-9_-]*' "$bld/ggml/src/CMakeFiles/ggml-cpu.dir/flags.make" 2>/dev/null | sort -u | tr '\n' ' ' || true
echo
ls -la "$bld/bin/llama-bench"
