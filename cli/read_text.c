/* read_text.c: see read_text.h. */
#include "read_text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char* read_text(const char* text, const char* path, size_t* len) {
    const char* name = path ? path : "standard input";
    if (text) {
        *len = strlen(text);
        char* copy = strdup(text);
        if (copy == NULL) fprintf(stderr, "run: error: out of memory\n");
        return copy;
    }
    const int fd = path ? open(path, O_RDONLY) : STDIN_FILENO;
    if (fd < 0) {
        fprintf(stderr, "run: error: %s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char* buf = malloc(cap);
    for (;;) {
        if (buf == NULL) {
            fprintf(stderr, "run: error: out of memory reading %s\n", name);
            break;
        }
        if (n + 1 >= cap) {
            char* bigger = realloc(buf, cap *= 2);
            if (bigger == NULL) free(buf);
            buf = bigger;
            continue;
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            fprintf(stderr, "run: error: cannot read %s: %s\n", name, strerror(errno));
            free(buf);
            buf = NULL;
            break;
        }
        if (got == 0) {
            buf[n] = '\0';
            *len = n;
            break;
        }
        n += (size_t)got;
    }
    if (path) close(fd);
    return buf;
}
