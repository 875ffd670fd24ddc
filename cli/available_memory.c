/* available_memory.c: the room memory has for a model's file (available_memory.h). A load reads
 * the file whole only where it fits: a larger file's first pages would be dropped again before a
 * token reached them, so reading it ahead costs the disk's time twice and a later first token
 * (docs/design.md#mapped-weights). */
#include "available_memory.h"

#include <stdio.h>
#include <string.h>

long long meminfo_available(const char* meminfo) {
    for (const char* line = meminfo; line != NULL;) {
        long long kb;
        if (strncmp(line, "MemAvailable:", 13) == 0)
            return sscanf(line + 13, "%lld", &kb) == 1 && kb >= 0 ? kb * 1024 : -1;
        line = strchr(line, '\n');
        if (line) line++;
    }
    return -1;
}

long long cgroup_limit_value(const char* limit) {
    long long v;
    /* "max" (v2) reads nothing; v1 writes "no limit" as a number near 2^63 */
    return sscanf(limit, "%lld", &v) == 1 && v > 0 && v < (1LL << 62) ? v : -1;
}

int cgroup_memory_dir(const char* self_cgroup, char* dir, size_t len, int* v1) {
    char v2_dir[4096] = "";
    for (const char* line = self_cgroup; line != NULL && *line;) {
        const char* end = strchr(line, '\n');
        const size_t n = end ? (size_t)(end - line) : strlen(line);
        const char* c1 = memchr(line, ':', n);
        const char* c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - line)) : NULL;
        if (c2 != NULL) {
            const int path_len = (int)(n - (size_t)(c2 + 1 - line));
            const int controllers = (int)(c2 - c1 - 1);
            int memory = 0; /* "memory" as one of the comma-separated controllers */
            for (const char* c = c1 + 1; c < c2;) {
                const char* comma = memchr(c, ',', (size_t)(c2 - c));
                const char* stop = comma ? comma : c2;
                memory |= stop - c == 6 && strncmp(c, "memory", 6) == 0;
                c = stop + 1;
            }
            if (memory) {
                *v1 = 1;
                return snprintf(dir, len, "/sys/fs/cgroup/memory%.*s", path_len, c2 + 1) < (int)len ? 0 : -1;
            }
            if (controllers == 0 && strncmp(line, "0:", 2) == 0)
                snprintf(v2_dir, sizeof v2_dir, "/sys/fs/cgroup%.*s", path_len, c2 + 1);
        }
        line = end ? end + 1 : NULL;
    }
    if (v2_dir[0] == '\0') return -1;
    *v1 = 0;
    return snprintf(dir, len, "%s", v2_dir) < (int)len ? 0 : -1;
}

/* The start of a small file (/proc's and cgroups' are a few KB at most) in buf, NUL-terminated; -1 if unreadable. */
static int read_small(const char* path, char* buf, size_t len) {
    FILE* f = fopen(path, "r");
    if (f == NULL) return -1;
    const size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* The lowest limit of the memory cgroup's folder and the folders above it, up to the hierarchy's
 * root (a limit applies to everything below it), or -1 with none. */
static long long cgroup_memory_limit(void) {
    char text[8192], dir[4096], file[4200], value[64];
    int v1;
    if (read_small("/proc/self/cgroup", text, sizeof text) != 0 || cgroup_memory_dir(text, dir, sizeof dir, &v1) != 0)
        return -1;
    const size_t root = strlen(v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup");
    long long lowest = -1;
    for (;;) {
        snprintf(file, sizeof file, "%s/%s", dir, v1 ? "memory.limit_in_bytes" : "memory.max");
        const long long v = read_small(file, value, sizeof value) == 0 ? cgroup_limit_value(value) : -1;
        if (v >= 0 && (lowest < 0 || v < lowest)) lowest = v;
        char* slash = strrchr(dir, '/');
        if (slash == NULL || (size_t)(slash - dir) < root) break;
        *slash = '\0';
    }
    return lowest;
}

long long available_memory(void) {
    char text[8192];
    long long room = read_small("/proc/meminfo", text, sizeof text) == 0 ? meminfo_available(text) : -1;
    const long long limit = cgroup_memory_limit();
    if (limit >= 0 && (room < 0 || limit < room)) room = limit;
    return room;
}
