/* output_path.c: the file that a tool writing a whole new file replaces, and the one a failed
 * streamed output removes (output_path.h). */
#include "output_path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int output_path_target(const char* path, char* target, size_t size, char* why, size_t why_size) {
    struct stat st, link;
    char resolved[PATH_MAX];
    const char* to = path;
    if (stat(path, &st) == 0) { /* else a new file */
        if (S_ISDIR(st.st_mode)) return snprintf(why, why_size, "is a directory"), -1;
        if (!S_ISREG(st.st_mode)) return snprintf(why, why_size, "is not a regular file (a device, FIFO or socket)"), -1;
        if (lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) {
            if (realpath(path, resolved) == NULL) return snprintf(why, why_size, "%s", strerror(errno)), -1;
            to = resolved;
        }
    } else if (lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) { /* a link to a file not yet there: it */
        char led[PATH_MAX];
        const ssize_t n = readlink(path, led, sizeof led - 1);
        if (n < 0 || n >= (ssize_t)sizeof led - 1) return snprintf(why, why_size, "cannot read the link"), -1;
        led[n] = '\0';
        const char* slash = strrchr(path, '/');
        const int in_folder = led[0] != '/' && slash != NULL; /* relative to the link's folder */
        if (snprintf(resolved, sizeof resolved, "%.*s%s%s", in_folder ? (int)(slash - path) : 0, path,
                     in_folder ? "/" : "", led) >= (int)sizeof resolved)
            return snprintf(why, why_size, "path too long"), -1;
        to = resolved;
    }
    if (strlen(to) >= size) return snprintf(why, why_size, "path too long"), -1;
    memcpy(target, to, strlen(to) + 1);
    return 0;
}

void output_path_written(FILE* f, const char* path, char* written, size_t size) {
    struct stat st;
    char resolved[PATH_MAX];
    written[0] = '\0';
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) return;
    const char* to = realpath(path, resolved) ? resolved : path; /* the file itself, not a link to it */
    if (strlen(to) < size) memcpy(written, to, strlen(to) + 1);
}
