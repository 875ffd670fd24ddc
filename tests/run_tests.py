#!/usr/bin/env python3
"""Runs every test: the C test programs (tests/test_*.c, built by `make test` into
$BUILD_DIR/tests/, default build/) and the Python tests (tests/test_*.py, unittest). Prints which
kernel paths the run exercised, then one closing line 'N passed, N failed, N skipped', and exits
non-zero when anything failed. Python 3 standard library only.

    python3 tests/run_tests.py [-v] [-j N] [NAME_FILTER ...]

A NAME_FILTER picks a C program or Python module whose name holds it (test_bench), or else the
Python tests whose ids do (test_bench.BenchMoe, ReferenceBuildThreads, test_only_digits).

The tests run in one worker process per CPU (-j N to choose): every test is independent of the
others' timing, and each worker's output is printed whole when its unit of tests ends. A unit
that a KeyboardInterrupt ends fails with its traceback (Ctrl-C ends the run: status 130), and a
worker that dies fails the units it had, so the run never waits for a lost worker.
"""
import concurrent.futures
import glob
import os
import platform
import subprocess
import sys
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
# The Python tests run the engine of the same build (tests/hf_model.py reads QWEN3_RUN).
os.environ.setdefault("QWEN3_RUN", os.path.join(BUILD_DIR, "run"))
os.environ["BUILD_DIR"] = BUILD_DIR

# Every kernel path a build can have, in the words test_kernels prints on its "kernel paths:" line.
ALL_PATHS = ["avx2+fma", "f16c", "avx512", "vnni", "avx512-bf16", "amx", "amx-bf16", "neon", "neon-dotprod"]
seen_paths = set()


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
            for line in p.stdout.splitlines():
                if line.startswith("kernel paths:"):
                    seen_paths.update(line.split(":", 1)[1].split())
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
        return c_test_case(binary, skip=f"{os.path.basename(binary)}: not built (`make test` builds it on x86-64, except "
                                        "with SCALAR=1 and where NATIVE targets AVX2 + FMA + F16C and nothing wider: "
                                        "there the native test_kernels runs the same twins)")
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


def reference_build():
    """Whether BUILD_DIR holds the reference build (make SCALAR=1): its compile line says so."""
    try:
        with open(os.path.join(BUILD_DIR, "flags")) as f:
            return "-DKERNELS_SCALAR" in f.read()
    except OSError:
        return False


def c_cases(wanted):
    """The C test programs of this build (test_kernels also without spinning, built for AVX2 only,
    and without AMX)."""
    cases = []
    for src in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.c"))):
        binary = os.path.join(BUILD_DIR, "tests", os.path.basename(src)[:-2])
        if not wanted(os.path.basename(binary)):
            continue
        if not os.path.exists(binary) and os.path.basename(binary) == "test_kernels" and reference_build():
            cases.append(c_test_case(binary, skip="test_kernels: the reference build (make SCALAR=1) has no fast "
                                                  "kernels; test_ops checks its ops"))
            continue
        if not os.path.exists(binary):
            sys.exit(f"run_tests.py: {binary} is not built (run `make test`)")
        cases.append(c_test_case(binary))
        if os.path.basename(binary) == "test_kernels":
            # the thread pool's other waiting mode: sleep at once, never spin
            cases.append(c_test_case(binary, {"KERNELS_SPIN_US": "0"}))
            cases.append(avx2_kernels_case(binary + "_avx2"))
            cases.append(no_amx_kernels_case(binary))
    return cases


def python_units(wanted):
    """The Python tests as units of work for the worker processes: one per test class, since a
    class shares its setUpClass work among its tests (test_model.EndToEnd's exports and reference
    logits: cut in two, it would compute them twice). Each unit is (estimated cost, [test ids])."""
    classes = {}
    loader = unittest.TestLoader()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        module = os.path.basename(path)[:-3]
        whole = wanted(module)  # else the tests whose ids a pattern names (test_bench.OneClass, a test's name)
        stack = [loader.loadTestsFromName(module)]
        while stack:
            for t in stack.pop():
                if isinstance(t, unittest.TestSuite):
                    stack.append(t)
                    continue
                if whole or wanted(t.id()):
                    classes.setdefault(t.id().rsplit(".", 1)[0], []).append(t.id())
    return [(UNIT_SECONDS.get(cls, 0.3 * len(ids)), sorted(ids)) for cls, ids in classes.items()]


# Rough seconds of the units that take longest on a 2-core machine (only their order matters): they
# start first, so that no long one is left to run alone at the end. Any other unit: 0.3 s a test.
UNIT_SECONDS = {
    "test_model.EndToEnd": 60, "test_tokenizer_unicode.TestEveryCodePoint": 13,
    "test_bench.BenchMode": 13, "test_bad_input.ExportErrors": 11, "C programs": 11,
    "test_compare_tool.CompareTool": 10, "test_export_input.CrashingInputs": 8,
    "test_norm_train_lab.NormTrainLab": 8, "test_random_models.MakeRandom": 7, "test_bench.BenchMoe": 6,
    "test_tokenizer.TestTokenizerReference": 7, "test_quantize.NothingLeftBehind": 6,
    "test_quantize.ExportUsesIt": 5, "test_model.TestReference": 5, "test_export_input.Limits": 5,
    "test_quantize.SameBytesAsExport": 4, "test_export_input.Fuzz": 4, "test_cli_usage.FreshCopy": 4,
}


def unit_name(unit):
    """The test classes of a unit, or "C programs"."""
    ids, c_indexes, _ = unit
    return ", ".join(sorted({i.rsplit(".", 1)[0] for i in ids})) or "C programs"


interrupted = []  # in a worker: a KeyboardInterrupt ended a unit (Ctrl-C), so the units after it do not run


def run_unit(unit):
    """Runs one unit in a worker process; returns what the parent reports."""
    import io
    if interrupted:
        return dict(ran=1, problems=[], failed=0, skipped_tests=1,
                    skipped=[(unit_name(unit), "not run: %s was interrupted before it in this worker" % interrupted[0])],
                    paths=[], log="")
    ids, c_indexes, patterns = unit
    wanted = lambda name: any(p in name for p in patterns)
    suite = unittest.TestSuite()
    if c_indexes:
        cases = c_cases(wanted)
        suite.addTests(cases[i] for i in c_indexes)
    for test_id in ids:
        suite.addTests(unittest.TestLoader().loadTestsFromName(test_id))
    stream = io.StringIO()
    saved, sys.stderr = sys.stderr, stream
    result = unittest.TextTestRunner(verbosity=2 if "-v" in sys.argv[1:] else 1, stream=stream)._makeResult()
    try:
        suite.run(result)
    except BaseException as e:  # a KeyboardInterrupt, say: the unit fails, and the worker lives to say so
        import traceback
        result.errors.append((unit_name(unit), "the unit ended early:\n" + traceback.format_exc()))
        if isinstance(e, KeyboardInterrupt):
            interrupted.append(unit_name(unit))
    finally:
        sys.stderr = saved
    problems = [(str(t), tb) for t, tb in result.failures + result.errors]
    problems += [(str(t), "unexpected success") for t in result.unexpectedSuccesses]
    # the tests that failed, and those skipped, each counted once however many of its subtests were
    failed = {getattr(t, "test_case", t).id() for t, _ in result.failures + result.errors}
    failed |= {t.id() for t in result.unexpectedSuccesses}
    skipped_tests = {getattr(t, "test_case", t).id() for t, _ in result.skipped} - failed
    return dict(ran=result.testsRun, problems=problems, failed=len(failed), skipped_tests=len(skipped_tests),
                skipped=[(str(t), r) for t, r in result.skipped], paths=sorted(seen_paths), log=stream.getvalue())


def main():
    """Runs the units on one worker process per CPU (at most -j N), the costliest first."""
    import multiprocessing
    args = sys.argv[1:]
    jobs = os.cpu_count() or 1
    if "-j" in args:
        k = args.index("-j")
        jobs = int(args[k + 1])
        del args[k:k + 2]
    patterns = [a for a in args if not a.startswith("-")] or [""]
    wanted = lambda name: any(p in name for p in patterns)
    os.chdir(ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    n_c = len(c_cases(wanted))
    units = [(cost, (ids, [], patterns)) for cost, ids in python_units(wanted)]
    if n_c:
        units.append((UNIT_SECONDS["C programs"], ([], list(range(n_c)), patterns)))
    units = [u for _, u in sorted(units, key=lambda cu: -cu[0])]

    t0 = time.time()
    ran, problems, skipped, n_failed, n_skipped = 0, [], [], 0, 0
    # A worker that dies (a signal, a crash) fails its unit and the run, rather than leaving the run
    # to wait for it forever, as multiprocessing.Pool does.
    ctx = multiprocessing.get_context("fork")
    pool = concurrent.futures.ProcessPoolExecutor(max(1, min(jobs, len(units))), mp_context=ctx)
    futures = {pool.submit(run_unit, u): u for u in units}
    try:
        for f in concurrent.futures.as_completed(futures):
            if f.exception() is not None:
                ran += 1
                n_failed += 1
                problems.append((unit_name(futures[f]), "not finished: %r (a worker process died while "
                                 "running this unit or another)" % f.exception()))
                continue
            r = f.result()
            sys.stderr.write(r["log"].split("\n----------------------------------------------------------------------\nRan ")[0])
            sys.stderr.flush()
            ran += r["ran"]
            problems += r["problems"]
            skipped += r["skipped"]
            n_failed += r["failed"]
            n_skipped += r["skipped_tests"]
            seen_paths.update(r["paths"])
    except KeyboardInterrupt:  # Ctrl-C: the workers' units end with it too, and no other starts
        pool.shutdown(wait=False, cancel_futures=True)
        sys.stderr.write("\nrun_tests.py: interrupted\n")
        return 130
    pool.shutdown()
    sys.stderr.write("\n")
    for name, tb in problems:
        sys.stderr.write("=" * 70 + f"\nFAIL: {name}\n" + "-" * 70 + f"\n{tb}\n")
    for name, reason in skipped:
        print(f"skipped: {name}: {reason}")
    if n_c and any("test_kernels" in p or not p for p in patterns):
        here = ", ".join(["scalar reference"] + [p for p in ALL_PATHS if p in seen_paths])
        print(f"kernels: {here}; "
              f"not here: {', '.join(p for p in ALL_PATHS if p not in seen_paths) or 'none'}")
    print(f"({time.time() - t0:.1f}s, {jobs} worker processes)")
    print(f"{ran - n_failed - n_skipped} passed, {n_failed} failed, {n_skipped} skipped")
    return 1 if problems or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
