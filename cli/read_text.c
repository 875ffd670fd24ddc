/* read_text.c: see read_text.h. */
#include "read_text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char* read_text(const char* text, const char* path, size_t* len) {
    if (text) {
        *len = strlen(text);
        char* copy = strdup(text);
        if (copy == NULL) fprintf(stderr, "run: error: out of memory\n");
        return copy;
    }
    if (path && strcmp(path, "-") == 0) path = NULL; /* "-": standard input */
    const int fd = path ? open(path, O_RDONLY) : STDIN_FILENO;
    if (fd < 0) {
        fprintf(stderr, "run: error: %s: cannot open: %s\n", path, strerror(errno));
        return NULL;
    }
    const char* name = path ? path : "standard input";
    size_t cap = 1 << 16, n = 0;
    char* buf = malloc(cap);
    ssize_t got = 1; /* stays > 0 until the end of the file or a read error */
    while (buf && got != 0) {
        if (n + 1 >= cap) {
            char* bigger = realloc(buf, cap *= 2);
            if (bigger == NULL) free(buf);
            buf = bigger;
        } else if ((got = read(fd, buf + n, cap - n - 1)) > 0) {
            if ((n += (size_t)got) > READ_TEXT_MAX) {
                fprintf(stderr, "run: error: %s: more than %d MiB of text, the most that run reads\n", name,
                        (int)(READ_TEXT_MAX >> 20));
                free(buf);
                buf = NULL;
                got = 0;
            }
        } else if (got < 0 && errno != EINTR) {
            fprintf(stderr, "run: error: cannot read %s: %s\n", name, strerror(errno));
            free(buf);
            buf = NULL;
        }
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    } else if (got > 0) { /* the loop ended on a failed allocation */
        fprintf(stderr, "run: error: out of memory reading %s\n", name);
    }
    if (path) close(fd);
    return buf;
}
