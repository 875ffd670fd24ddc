/* read_all.c: see read_all.h. */
#include "read_all.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char* read_all(int fd, const char* name, size_t* len) {
    size_t cap = 1 << 16, n = 0;
    char* buf = malloc(cap);
    for (;;) {
        if (buf == NULL) {
            fprintf(stderr, "run: error: out of memory reading %s\n", name);
            return NULL;
        }
        if (n + 1 >= cap) {
            cap *= 2;
            char* bigger = realloc(buf, cap);
            if (bigger == NULL) free(buf);
            buf = bigger;
            continue;
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            fprintf(stderr, "run: error: cannot read %s: %s\n", name, strerror(errno));
            free(buf);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
