#!/usr/bin/env bash
# Builds BUILD_DIR/arbor-tok: the arbor CLI with only the tokenizer verbs (tokenize, detokenize,
# bench-tokenizer), for when the full `arbor` target is not buildable. Needs BUILD_DIR's arbor_tokenizer
# and arbor_core libraries (cmake --build BUILD_DIR --target arbor_tokenizer).
# Usage: bench/tokenizer/build_cli.sh [BUILD_DIR]   (default build-tok)
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build-tok}
cmake --build "$b" --target arbor_tokenizer arbor_core
g++ -std=c++20 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -Isrc \
  src/cli/main.cpp src/cli/args.cpp src/cli/cmd_tokenize.cpp src/cli/cmd_bench_tokenizer.cpp \
  "$b/libarbor_tokenizer.a" "$b/libarbor_core.a" $(pkg-config --libs libpcre2-8 libutf8proc) -lfmt -lpthread \
  -o "$b/arbor-tok"
echo "built $b/arbor-tok"
