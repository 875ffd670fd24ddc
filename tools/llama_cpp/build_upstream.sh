#!/usr/bin/env bash
# Builds upstream llama.cpp's own llama-bench from a source tree of it (a clone of
# github.com/ggml-org/llama.cpp, or a snapshot of one), native CPU build, for
# tools/llama_cpp/compare.py --llama-bench (docs/speed.md#beside-llamacpp). Needs cmake and a
# C++17 compiler; a few minutes on two cores.
#
#   tools/llama_cpp/build_upstream.sh SRC [OUT]      OUT: default build/llama_cpp/upstream
#   python3 tools/llama_cpp/compare.py --llama-bench OUT/bin/llama-bench [--size 1.7b] ...
set -euo pipefail
src="${1:?usage: build_upstream.sh LLAMA_CPP_SOURCE_DIR [OUT]}"
out="${2:-build/llama_cpp/upstream}"
[ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || { echo "build_upstream.sh: $src is not a llama.cpp source tree" >&2; exit 1; }
commit=$(git -C "$src" rev-parse --short=9 HEAD 2>/dev/null || echo "unknown (not a git checkout)")
echo "build_upstream.sh: llama.cpp $commit from $src into $out" >&2
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
cmake --build "$out" --target llama-bench -j"$(nproc)" >&2
echo "$out/bin/llama-bench"
