#!/usr/bin/env python3
"""Runs every test: the C test programs (tests/test_*.c, built by `make test`) and the Python
tests (tests/test_*.py, unittest). Prints one closing line 'N passed, N failed, N skipped' and
exits non-zero when anything failed. Python 3 standard library only.

    python3 tests/run_tests.py [-v] [NAME_FILTER]
"""
import glob
import os
import platform
import subprocess
import sys
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def c_test_case(binary, env=None, skip=None):
    """A unittest case that runs one C test program (with extra environment variables env) and
    passes when it exits 0; skipped with the reason skip when that is given."""
    name = os.path.basename(binary) + "".join(f" {k}={v}" for k, v in (env or {}).items())

    class CTest(unittest.TestCase):
        def runTest(self):
            if skip:
                self.skipTest(skip)
            p = subprocess.run([binary], cwd=ROOT, capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, **(env or {})))
            if p.returncode != 0:
                self.fail(f"{name} exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
            last = (p.stdout.strip().splitlines() or [""])[-1]
            sys.stderr.write(f"  [{name}] {last}\n")

        def __str__(self):
            return f"{name} (C test program)"

    return CTest()


def avx2_kernels_case(binary):
    """The kernel tests built for AVX2 + FMA only (the Makefile builds them on x86-64): the AVX2
    twins without the AVX-512 tiles and VNNI that a native build on a newer CPU takes instead."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return c_test_case(binary, skip=f"{os.path.basename(binary)}: x86-64 only (this is {platform.machine()})")
    if not {"avx2", "fma"} <= cpu_flags():
        return c_test_case(binary, skip=f"{os.path.basename(binary)}: no AVX2 + FMA in /proc/cpuinfo")
    if not os.path.exists(binary):
        sys.exit(f"run_tests.py: {binary} is not built (run `make test`)")
    return c_test_case(binary)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def no_amx_kernels_case(binary):
    """On a CPU with AMX the native build runs q8 and q4 prefill on its tiles; KERNELS_AMX=0 runs the same
    tests through the AVX-512 kernels that AMX replaces there."""
    if not {"amx_tile", "amx_int8"} <= cpu_flags():
        return c_test_case(binary, {"KERNELS_AMX": "0"},
                           skip="no AMX on this CPU: test_kernels already ran without it")
    return c_test_case(binary, {"KERNELS_AMX": "0"})


def main():
    verbose = "-v" in sys.argv[1:]
    pattern = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    os.chdir(ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    suite = unittest.TestSuite()
    for src in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.c"))):
        binary = src[:-2]
        if pattern in os.path.basename(binary):
            if not os.path.exists(binary):
                sys.exit(f"run_tests.py: {binary} is not built (run `make test`)")
            suite.addTest(c_test_case(binary))
            if os.path.basename(binary) == "test_kernels":
                # the thread pool's other waiting mode: sleep at once, never spin (what pool.c
                # switches to while another process holds a core)
                suite.addTest(c_test_case(binary, {"KERNELS_SPIN_US": "0"}))
                suite.addTest(avx2_kernels_case(binary + "_avx2"))
                suite.addTest(no_amx_kernels_case(binary))
    loader = unittest.TestLoader()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        module = os.path.basename(path)[:-3]
        if pattern and pattern not in module:
            continue
        suite.addTests(loader.loadTestsFromName(module))

    t0 = time.time()
    runner = unittest.TextTestRunner(verbosity=2 if verbose else 1, stream=sys.stderr)
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    for test, reason in result.skipped:
        print(f"skipped: {test}: {reason}")
    print(f"({time.time() - t0:.1f}s)")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or result.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
