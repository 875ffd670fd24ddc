/* check.h: the one assertion of the C test programs. check() counts a check and prints the failed
 * ones; checks_done() prints the closing line "N passed, M failed" that tests/run_tests.py shows
 * and returns the program's exit status. */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <stdio.h>
#include <unistd.h>

static int n_pass, n_fail;

static void check(int ok, const char* what) {
    if (ok) {
        n_pass++;
    } else {
        n_fail++;
        printf("FAIL: %s\n", what);
    }
}

/* 1 where path can be read, else 0 after the line that says the program skipped (the tests run
 * from the repository root, where the shipped model is). */
static inline int readable_or_skipped(const char* path) {
    if (access(path, R_OK) == 0) return 1;
    printf("skipped: %s not found (run from the repository root)\n", path);
    return 0;
}

static int checks_done(void) {
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif
