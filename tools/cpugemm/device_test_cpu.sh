#!/usr/bin/env bash
# Builds tests/cpu (arbor_core + arbor_cpu sources, gtest, fmt) with plain g++ and runs it: for a
# machine that has the compilers and those libraries but not the rest of arbor's dependencies (the
# GPU lease hosts, whose CPUs have AVX-512 BF16). Usage: tools/cpugemm/device_test_cpu.sh [gtest args]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
b=${BUILD:-/tmp/arbor-cpu-test}
mkdir -p "$b"
flags=(-std=c++20 -O2 -DNDEBUG -Wall -Wextra -Werror -Wno-unused-parameter -I"$repo/src")
for f in "$repo"/src/core/*.cpp "$repo"/src/backend/cpu/*.cpp; do
  g++ "${flags[@]}" -c "$f" -o "$b/$(basename "$f").o" &
done
wait
g++ "${flags[@]}" -DARBOR_SOURCE_DIR="\"$repo\"" "$repo"/tests/cpu/*.cpp "$b"/*.o -lfmt -lgtest -lgtest_main -pthread -o "$b/test_cpu"
"$b/test_cpu" "$@" || rc=$?
if [ -n "${SPEED:-}" ]; then
  g++ "${flags[@]}" "$repo/tools/cpugemm/gemm_speed.cpp" "$b"/*.o -lfmt -pthread -o "$b/gemm_speed"
  "$b/gemm_speed" 2
  "$b/gemm_speed" 1
fi
exit ${rc:-0}
