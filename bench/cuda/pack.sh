#!/usr/bin/env bash
# Copies the binaries built here (build/arbor, build/test_cuda, and any other build/NAME given) into
# .cudarun/ with the non-system shared libraries they need (lib/), for the GPU machine:
#   bash bench/cuda/pack.sh [--sm90] [extra binaries...]; then run(command="bash bench/cuda/run_device.sh", carry=[".cudarun"])
# The GPU machine has glibc, libstdc++ and CUDA's libraries (/usr/local/cuda/lib64) but not these.
# The device tool carries at most 64 MiB with the tracked tree (~42 MB), so the binaries travel stripped
# and xz-compressed (NAME.xz); run_device.sh unpacks them on the GPU machine.
# --sm90: first builds build-sm90/ (scripts/build with CMAKE_CUDA_ARCHITECTURES=90a-real: Hopper code only, without
# the compute_80 PTX the default build embeds for other GPUs) and packs from it. The PTX is most of the compressed
# size (affine_gemv.cu's object: 3.4 MB xz with it, 0.8 MB without), so this is the pack that leaves room for more
# binaries beside arbor and test_cuda (bench_trellis, an A/B copy of arbor).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --sm90 ]; then
  shift
  ARBOR_BUILD_DIR=build-sm90 scripts/build -DCMAKE_CUDA_ARCHITECTURES=90a-real
  export ARBOR_BUILD_DIR=build-sm90
fi
b=${ARBOR_BUILD_DIR:-build}
rm -rf .cudarun && mkdir -p .cudarun/lib
for n in arbor test_cuda "$@"; do
  strip -o ".cudarun/$n" "$b/$n"
  xz -T2 -9 ".cudarun/$n"
done
for lib in libpcre2-8.so.0 libutf8proc.so.2 libfmt.so.9 libedit.so.2 libtinfo.so.6 libbsd.so.0 libmd.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .cudarun/lib/
done
du -sh .cudarun
