#!/usr/bin/env bash
# Builds upstream llama.cpp's own llama-bench from a source tree of it (a clone of
# github.com/ggml-org/llama.cpp, or a snapshot of one) for tools/llama_cpp/compare.py
# --llama-bench (docs/speed.md#beside-llamacpp): a native CPU build, or with x86-64-v3 one for
# AVX2 + FMA + F16C only, to set beside this engine's `make NATIVE=-march=x86-64-v3`. Needs cmake
# and a C++17 compiler; a few minutes on two cores.
#
#   tools/llama_cpp/build_upstream.sh SRC [OUT [x86-64-v3]]   OUT: default build/llama_cpp/upstream
#   python3 tools/llama_cpp/compare.py --llama-bench OUT/bin/llama-bench [--size 1.7b] ...
set -euo pipefail
src="${1:?usage: build_upstream.sh LLAMA_CPP_SOURCE_DIR [OUT [x86-64-v3]]}"
out="${2:-build/llama_cpp/upstream}"
case "${3:-native}" in
    native) cpu=(-DGGML_NATIVE=ON) ;;
    x86-64-v3) cpu=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON) ;;
    *) echo "build_upstream.sh: the target is native or x86-64-v3, not '$3'" >&2; exit 2 ;;
esac
[ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || { echo "build_upstream.sh: $src is not a llama.cpp source tree" >&2; exit 1; }
commit=$(git -C "$src" rev-parse --short=9 HEAD 2>/dev/null || echo "unknown (not a git checkout)")
echo "build_upstream.sh: llama.cpp $commit from $src into $out (${3:-native})" >&2
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release "${cpu[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
cmake --build "$out" --target llama-bench -j"$(nproc)" >&2
echo "$out/bin/llama-bench"
