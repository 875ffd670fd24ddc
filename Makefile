# `make` builds ./run. `make run` tells a story with the shipped model. `make test` runs every test.
# `make ref` builds the reference engine, build/scalar/run.
# `make bench` measures prefill and decode speed. Needs a C11 compiler, make and Python 3.
#
# The user's variables (CC, CFLAGS, NATIVE, SCALAR) choose the compiler, the optimisation and warnings,
# and the instruction set; what the code itself needs (C11, _GNU_SOURCE, the include path) is in
# REQUIRED_FLAGS and always applies, so `make CFLAGS=-O3` or `make CC=clang` build as well as `make`.
# Each engine source compiles once into build/obj/, and ./run and every test program link those objects.
CC ?= cc
CFLAGS ?= -O2 -Wall -Wextra -Wno-unused-parameter
# SIMD kernels are chosen at compile time from what the compiler targets (kernels/simd_math.h):
# NATIVE is the target (e.g. NATIVE=-march=x86-64-v3 for AVX2 only); `make SCALAR=1` (or `make ref`,
# into build/scalar) builds the reference engine: the scalar kernels only, one thread, no kernels/fast/.
UNAME_M := $(shell uname -m)
ifeq ($(UNAME_M),x86_64)
  NATIVE ?= -march=native
else
  NATIVE ?= -mcpu=native
endif
REQUIRED_FLAGS := -std=c11 -D_GNU_SOURCE -I.
LDLIBS := -lm -lpthread
ifdef SCALAR
  REQUIRED_FLAGS += -DKERNELS_SCALAR
  LDLIBS := -lm
endif
PYTHON ?= python3
# Both cores (or however many there are) compile unless the user gives -j themselves; a sub-make
# (make ref, make test-scalar) shares its parent's jobs.
ifeq ($(filter -j%,$(MAKEFLAGS))$(filter-out 0,$(MAKELEVEL)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

COMPILE = $(CC) $(REQUIRED_FLAGS) $(NATIVE) $(CFLAGS) $(CPPFLAGS)
# Two builds of one model (kernels/ops.h): the reference kernels and their ops are in kernels/*.c;
# the fast ones (the thread pool, the product plan, the SIMD product twins) in kernels/fast/. The
# reference build compiles none of kernels/fast/: one thread, no scratch beyond a row of scores,
# nothing read from /proc.
REF_KERNEL_SRC := $(wildcard kernels/*.c)
FAST_KERNEL_SRC := $(wildcard kernels/fast/*.c kernels/fast/x86/*.c kernels/fast/arm/*.c)
ifdef SCALAR
  KERNEL_SRC := $(REF_KERNEL_SRC)
else
  KERNEL_SRC := $(REF_KERNEL_SRC) $(FAST_KERNEL_SRC)
endif
ENGINE_SRC := model.c checkpoint.c $(KERNEL_SRC) $(wildcard tokenizer/*.c) $(wildcard cli/*.c)
# B is the build folder; `make test-scalar` builds the scalar reference in build/scalar beside it.
B ?= build
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(B)/obj/%.o)
# test_kernels checks the fast kernels themselves, which the reference build does not have.
TEST_BIN := $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c))
ifdef SCALAR
  TEST_BIN := $(filter-out $(B)/tests/test_kernels,$(TEST_BIN))
endif

SHIPPED_MODEL := models/tinystories.bin
STORY_PROMPT ?= Once upon a time
STORY_FLAGS ?= -n 250

.PHONY: all programs ref run test test-scalar test-sanitizers bench clean test-arm norm-precision norm-grad norm-lab norm-train-lab fuzz-tokenizer FORCE
# Keep the test programs' objects (make deletes intermediate files otherwise, and relinks next time).
.SECONDARY:

all: $(B)/run

# The compile line of the last build, rewritten only when it changes: every object depends on it,
# so `make SCALAR=1` after a plain `make` rebuilds instead of answering "Nothing to be done".
$(B)/flags: FORCE
	@mkdir -p $(B)
	@echo '$(COMPILE) $(LDLIBS)' | cmp -s - $@ || echo '$(COMPILE) $(LDLIBS)' > $@

$(B)/obj/%.o: %.c $(B)/flags
	@mkdir -p $(dir $@)
	$(COMPILE) -MMD -MP -c -o $@ $<

$(B)/libengine.a: $(ENGINE_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The engine is linked as build/run and then to ./run, so that `make run` can be the command that
# tells a story (llama2.c's habit) while `./run` stays the program's name.
$(B)/run: $(B)/obj/run.o $(B)/libengine.a
	$(COMPILE) -o $@ $^ $(LDLIBS)
	@if [ "$(B)" = build ]; then ln -f $@ run; fi

run: all
	./run $(SHIPPED_MODEL) -i "$(STORY_PROMPT)" $(STORY_FLAGS)

# The RMSNorm precision lab: a Markdown report on stdout (docs/norm-precision.md is its output).
norm-precision: $(B)/tools/norm_precision
	$(B)/tools/norm_precision

$(B)/tools/norm_precision: $(B)/obj/tools/norm_precision.o $(B)/libengine.a
	@mkdir -p $(dir $@)
	$(COMPILE) -o $@ $^ $(LDLIBS)

# `make norm-grad`: RMSNorm's backward pass worked on one small vector (docs/rmsnorm.md, the
# backward pass): the formula's dx beside a central difference's, and x . dx as eps changes.
norm-grad: $(B)/tools/norm_grad
	$(B)/tools/norm_grad

$(B)/tools/norm_grad: $(B)/obj/tools/norm_grad.o $(B)/libengine.a
	@mkdir -p $(dir $@)
	$(COMPILE) -o $@ $^ $(LDLIBS)

$(B)/tests/%: $(B)/obj/tests/%.o $(B)/libengine.a
	@mkdir -p $(dir $@)
	$(COMPILE) -o $@ $^ $(LDLIBS)

# On x86-64 the kernel tests are built once more for AVX2 + FMA + F16C without AVX-512 or VNNI,
# so that the AVX2 twins stay tested on machines whose native build takes the wider paths
# (run_tests.py skips it on a CPU without AVX2). Only the kernels are compiled again, and not where
# NATIVE already targets exactly that (a Zen 3, say): there test_kernels runs the same twins.
AVX2_FLAGS := -march=x86-64 -mavx2 -mfma -mf16c
AVX2_COMPILE = $(CC) $(REQUIRED_FLAGS) $(AVX2_FLAGS) $(CFLAGS) $(CPPFLAGS)
ifeq ($(UNAME_M),x86_64)
ifndef SCALAR
NATIVE_MACROS := $(shell $(CC) $(NATIVE) -dM -E -x c /dev/null 2>/dev/null)
NATIVE_IS_AVX2 := $(and $(filter __AVX2__,$(NATIVE_MACROS)),$(filter __FMA__,$(NATIVE_MACROS)),\
                        $(filter __F16C__,$(NATIVE_MACROS)),$(if $(filter __AVX512F__ __AVXVNNI__,$(NATIVE_MACROS)),,yes))
ifeq ($(NATIVE_IS_AVX2),)
TEST_VARIANTS := $(B)/tests/test_kernels_avx2
endif
endif
endif
$(B)/obj-avx2/%.o: %.c $(B)/flags
	@mkdir -p $(dir $@)
	$(AVX2_COMPILE) -MMD -MP -c -o $@ $<
$(B)/tests/test_kernels_avx2: $(B)/obj-avx2/tests/test_kernels.o $(KERNEL_SRC:%.c=$(B)/obj-avx2/%.o)
	@mkdir -p $(dir $@)
	$(AVX2_COMPILE) -o $@ $^ $(LDLIBS)

# Every program the tests run: the engine, the C tests, the RMSNorm tools.
programs: all $(TEST_BIN) $(B)/tools/norm_precision $(B)/tools/norm_grad

# The tests find the programs of this build through BUILD_DIR (run_tests.py, hf_model.py).
test: programs $(TEST_VARIANTS)
	BUILD_DIR=$(B) $(PYTHON) tests/run_tests.py $(TESTS)

# `make ref`: the reference engine (the same as `make SCALAR=1`), in build/scalar, so that ./run
# stays the fast build: build/scalar/run.
ref:
	@$(MAKE) --no-print-directory SCALAR=1 B=build/scalar all

# Every test of `make test` on the reference build, in build/scalar (CI runs it after `make test`):
# the reference engine cannot rot unseen. The tests of the thread pool, the tuning variables and
# the fast kernels skip there with the reason; TESTS picks some, as for `make test`.
test-scalar:
	@$(MAKE) --no-print-directory SCALAR=1 B=build/scalar test

# `make test-sanitizers`: every test of `make test` once more on a build with AddressSanitizer
# (LeakSanitizer with it) and UBSan, in build/sanitize, so that a read past a buffer, memory left
# behind on an error path or an out-of-range conversion fails a test instead of passing unseen. CI
# runs it after test-scalar. SAN_CC is the compiler (clang by default; gcc 12 works too); without
# it the target skips with one line.
SAN_CC ?= clang
SAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Wno-unused-parameter
test-sanitizers:
	@if ! command -v $(SAN_CC) >/dev/null 2>&1; then echo "test-sanitizers: skipped ($(SAN_CC) not found)"; exit 0; fi; \
	$(MAKE) --no-print-directory CC=$(SAN_CC) CFLAGS="$(SAN_CFLAGS)" B=build/sanitize test

-include $(shell find $(B)/obj $(B)/obj-avx2 -name '*.d' 2>/dev/null)

# `make bench`: random checkpoints with the real shape of each Qwen3 size in BENCH_SIZES
# (0.6b 1.7b 4b 8b 14b 30b-a3b; written once: 2 bytes a parameter for a dense size's Hugging Face
# folder, then each format; 30b-a3b straight in the engine's format), then `./run MODEL -m bench
# --threads 1,2` for each format (the thread counts take turns in one process). BENCH_LAYERS cuts
# every size to that many layers. tools/bench_models.py skips, saying why, a format whose file
# would not fit in memory (half of it; 3/4 for 30b-a3b) or on the disk; with every format of every
# size skipped, bench fails with one line.
BENCH_DIR ?= build/bench
BENCH_SIZES ?= 0.6b
BENCH_DTYPES ?= q8 q4 bf16 f32
BENCH_THREADS ?= 1,2
BENCH_ARGS ?=
BENCH_LAYERS ?=
bench: all
	@benched=0; for size in $(BENCH_SIZES); do \
	  models=$$($(PYTHON) tools/bench_models.py $(BENCH_DIR) $(BENCH_DTYPES) --size $$size \
	    $(if $(BENCH_LAYERS),--layers $(BENCH_LAYERS))) || exit 1; \
	  for model in $$models; do \
	    echo "== $$(basename $$model .bin)"; \
	    ./run $$model -m bench --threads $(BENCH_THREADS) $(BENCH_ARGS) || exit 1; \
	    benched=$$((benched + 1)); \
	  done; \
	done; \
	if [ $$benched -eq 0 ]; then echo "make bench: nothing benchmarked: every format of $(BENCH_SIZES) skipped (the reasons above)" >&2; exit 1; fi

# `make norm-lab`: the shipped model's loss, perplexity and top-1 on a validation excerpt, as trained
# and with each RMSNorm use left out or changed (./run --ablate, --norm-eps, --norm), plus greedy
# samples (docs/norm-lab.md), and the pictures of its RMSNorm trace and of the attention scores with
# and without QK-Norm (docs/norms-*.svg). About a minute.
norm-lab: all
	$(PYTHON) tools/norm_lab.py
	$(PYTHON) tools/plot_norms.py lab $(SHIPPED_MODEL) --out-dir docs

# `make norm-train-lab`: the shipped model's shape trained from one seed on the same batches as Qwen3
# has it, without QK-Norm, with post-norm, with no norms, with LayerNorm, and the first two at a
# higher learning rate; the loss, the largest attention logit and the residual stream's rms per layer
# against the step (build/norm-train-lab/*.json), the report docs/norm-train-lab.md and its pictures
# docs/norm-train-*.svg. About 17 minutes on 2 cores. Training tools use Debian's PyTorch through
# /usr/bin/python3 (tools/train.py too), so this is not part of `make test`.
norm-train-lab:
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "norm-train-lab: /usr/bin/python3 has no torch: apt-get install python3-torch"; exit 1; }
	/usr/bin/python3 tools/norm_train_lab.py

# `make fuzz-tokenizer`: the tokenizer under libFuzzer with AddressSanitizer and UBSan (clang
# only), for FUZZ_SECONDS on FUZZ_CHECKPOINT's tokenizer (tools/fuzz_tokenizer.c: what it checks).
FUZZ_SECONDS ?= 60
FUZZ_CHECKPOINT ?= $(SHIPPED_MODEL)
fuzz-tokenizer:
	@if ! command -v clang >/dev/null 2>&1; then echo "fuzz-tokenizer: skipped (clang not found)"; exit 0; fi; \
	mkdir -p $(B)/tools $(B)/fuzz-corpus && \
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -I. \
	  -o $(B)/tools/fuzz_tokenizer tools/fuzz_tokenizer.c $(wildcard tokenizer/*.c) && \
	TOK_SECTION=$(FUZZ_CHECKPOINT) $(B)/tools/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) \
	  -max_len=4096 $(B)/fuzz-corpus

clean:
	rm -rf run build/run build/flags build/obj build/obj-avx2 build/libengine.a build/tests build/tools build/arm build/arm-* build/scalar build/sanitize build/fuzz-corpus

# `make test-arm`: every test on the arm64 build, cross-compiled (static) and run under qemu-aarch64
# (user mode), once with SDOT (armv8.2-a+dotprod) and once without (armv8-a), so both q8 dot paths of
# the NEON twins run, in the kernel tests and in whole models against the Python reference. The
# programs of -march=M are built in build/arm-M/bin; build/arm-M holds a script per program that runs
# it under qemu, and run_tests.py takes that folder as its build (QWEN3_EMULATOR tells the tests that
# read another process's /proc, which shows qemu's signal handlers, to skip). A correctness check only:
# qemu says nothing about arm64 speed. About seven minutes a -march on two cores; not part of `make test`
# (CI machines have no cross tools); it skips with one line when they are missing.
ARM_CC ?= aarch64-linux-gnu-gcc
ARM_QEMU ?= qemu-aarch64
ARM_MARCHES ?= armv8.2-a+dotprod armv8-a
test-arm:
	@if ! command -v $(ARM_CC) >/dev/null 2>&1; then echo "test-arm: skipped ($(ARM_CC) not found)"; exit 0; fi; \
	qemu=$$(command -v $(ARM_QEMU)) || { echo "test-arm: skipped ($(ARM_QEMU) not found)"; exit 0; }; \
	for m in $(ARM_MARCHES); do \
	  d=build/arm-$$m; \
	  echo "== every test, arm64 -march=$$m, under $(ARM_QEMU)"; \
	  $(MAKE) --no-print-directory CC=$(ARM_CC) NATIVE=-march=$$m CFLAGS="$(CFLAGS) -static" B=$$d/bin programs \
	    || exit 1; \
	  for f in $$d/bin/run $$d/bin/tests/* $$d/bin/tools/*; do \
	    w=$$d/$${f#$$d/bin/}; mkdir -p $$(dirname $$w) || exit 1; \
	    printf '#!/bin/sh\nexec "%s" "%s" "$$@"\n' "$$qemu" "$$PWD/$$f" > $$w && chmod +x $$w || exit 1; \
	  done; \
	  QWEN3_EMULATOR=$(ARM_QEMU) BUILD_DIR=$$d $(PYTHON) tests/run_tests.py $(TESTS) || exit 1; \
	done
