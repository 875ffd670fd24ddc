# Build: `make` builds ./run. `make run` tells a story with the shipped model. `make test` runs every test.
# `make bench` measures prefill and decode speed. No dependency beyond a C11 compiler, make and Python 3.
CC ?= cc
OPT ?= -O2
# SIMD kernels are chosen at compile time from what the compiler targets (AVX2+FMA or NEON);
# `make SCALAR=1` builds the scalar reference kernels only.
UNAME_M := $(shell uname -m)
ifeq ($(UNAME_M),x86_64)
  NATIVE ?= -march=native
else
  NATIVE ?= -mcpu=native
endif
ifdef SCALAR
  NATIVE += -DKERNELS_SCALAR
endif
CFLAGS ?= -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(OPT) $(NATIVE)
LDLIBS = -lm -lpthread
PYTHON ?= python3

# Every top-level .c file except run.c is part of the engine library.
ENGINE_SRC := $(filter-out run.c,$(wildcard *.c))
ENGINE_HDR := $(wildcard *.h)
TEST_C := $(wildcard tests/*.c)
TEST_BIN := $(TEST_C:.c=)

SHIPPED_MODEL := models/tinystories.bin
STORY_PROMPT ?= Once upon a time
STORY_FLAGS ?= -n 250

.PHONY: all run test bench clean test-arm FORCE

# The engine is built as build/run and linked to ./run, so that `make run` can be the command that
# tells a story (llama2.c's habit) while `./run` stays the program's name.
all: build/run

# The compiler and flags of the last build, rewritten only when they change: the binaries depend on
# it, so `make SCALAR=1` or `make NATIVE=-march=x86-64-v3` after a plain `make` rebuilds them
# instead of answering "Nothing to be done".
BUILD_FLAGS := $(CC) $(CFLAGS) $(LDLIBS)
build/flags: FORCE
	@mkdir -p build
	@echo '$(BUILD_FLAGS)' | cmp -s - $@ || echo '$(BUILD_FLAGS)' > $@

build/run: run.c $(ENGINE_SRC) $(ENGINE_HDR) build/flags
	$(CC) $(CFLAGS) -o $@ run.c $(ENGINE_SRC) $(LDLIBS)
	@ln -f $@ run

run: all
	./run $(SHIPPED_MODEL) -i "$(STORY_PROMPT)" $(STORY_FLAGS)

tests/%: tests/%.c $(ENGINE_SRC) $(ENGINE_HDR) build/flags
	$(CC) $(CFLAGS) -I. -o $@ $< $(ENGINE_SRC) $(LDLIBS)

# On x86-64 the kernel tests are built once more for the issue's instruction set, AVX2 + FMA
# (+ F16C, which every AVX2 CPU has, for the fp16 KV cache) without AVX-512 or VNNI
# (-march=x86-64 -mavx2 -mfma -mf16c), so that the AVX2 twins stay tested on machines whose native
# build takes the AVX-512 tiles or VNNI (run_tests.py skips it on a CPU without AVX2).
ifeq ($(UNAME_M),x86_64)
TEST_VARIANTS := tests/test_kernels_avx2
endif
tests/test_kernels_avx2: tests/test_kernels.c $(ENGINE_SRC) $(ENGINE_HDR) build/flags
	$(CC) $(filter-out $(NATIVE),$(CFLAGS)) -march=x86-64 -mavx2 -mfma -mf16c -I. -o $@ $< $(ENGINE_SRC) $(LDLIBS)

test: all $(TEST_BIN) $(TEST_VARIANTS)
	$(PYTHON) tests/run_tests.py

# `make bench`: a random checkpoint with the real Qwen3-0.6B shape (written once, about 1.2 GB),
# exported to each format (again when this engine cannot read the file there, e.g. an older q8
# layout), then `./run MODEL -m bench --threads 1,2` for each format (the thread counts take turns
# in one process).
BENCH_DIR ?= build/bench
BENCH_DTYPES ?= q8 q4 bf16 f32
BENCH_THREADS ?= 1,2
BENCH_ARGS ?=
bench: all
	@$(PYTHON) tools/bench_models.py $(BENCH_DIR) $(BENCH_DTYPES)
	@for dt in $(BENCH_DTYPES); do \
	  echo "== $$dt"; \
	  ./run $(BENCH_DIR)/qwen3-0.6b-$$dt.bin -m bench --threads $(BENCH_THREADS) $(BENCH_ARGS) || exit 1; \
	done

clean:
	rm -rf run build/run build/flags build/arm $(TEST_BIN) tests/test_kernels_avx2

# `make test-arm`: the kernel tests cross-compiled for arm64 and run under qemu-aarch64 (user mode),
# once with SDOT (armv8.2-a+dotprod) and once without (armv8-a), so both q8 dot paths of the NEON
# twins run. A correctness check only: qemu says nothing about arm64 speed. Not part of `make test`
# (CI machines have no cross tools); it skips with one line when they are missing.
ARM_CC ?= aarch64-linux-gnu-gcc
ARM_QEMU ?= qemu-aarch64
ARM_MARCHES ?= armv8.2-a+dotprod armv8-a
ARM_CFLAGS ?= -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -O2 -static
test-arm:
	@if ! command -v $(ARM_CC) >/dev/null 2>&1; then echo "test-arm: skipped ($(ARM_CC) not found)"; exit 0; fi; \
	if ! command -v $(ARM_QEMU) >/dev/null 2>&1; then echo "test-arm: skipped ($(ARM_QEMU) not found)"; exit 0; fi; \
	mkdir -p build/arm || exit 1; \
	for m in $(ARM_MARCHES); do \
	  echo "== test_kernels, arm64 -march=$$m, under $(ARM_QEMU)"; \
	  $(ARM_CC) $(ARM_CFLAGS) -march=$$m -I. -o build/arm/test_kernels-$$m tests/test_kernels.c \
	    $(ENGINE_SRC) $(LDLIBS) || exit 1; \
	  $(ARM_QEMU) build/arm/test_kernels-$$m || exit 1; \
	done
