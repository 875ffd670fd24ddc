/* check.h: the one assertion of the C test programs. check() counts a check and prints the failed
 * ones; checks_done() prints the closing line "N passed, M failed" that tests/run_tests.py shows
 * and returns the program's exit status. */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <stdio.h>

static int n_pass, n_fail;

static void check(int ok, const char* what) {
    if (ok) {
        n_pass++;
    } else {
        n_fail++;
        printf("FAIL: %s\n", what);
    }
}

static int checks_done(void) {
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif
