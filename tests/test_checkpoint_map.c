/* tests/test_checkpoint_map.c: checkpoint_map() gives back the file's exact bytes, mapped at a
 * 2 MB boundary or copied, for sizes around the 2 MB page size, on a freshly written file (whose
 * page cache is in small pages, so the drop-and-refill path runs where the OS supports it) and
 * again on the same file. Where the first load refilled the cache, the second must find it in
 * 2 MB pages and not refill it again (a refill on every load would re-read the file from disk).
 * Whether 2 MB pages are had at all depends on the kernel and filesystem, so that is reported,
 * not asserted. */
#include "checkpoint_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MB2 ((size_t)2 << 20)

static int passed = 0, failed = 0;

static void check(int ok, const char* what, size_t size) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s (file of %zu bytes)\n", what, size);
    }
}

static unsigned char pattern_byte(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static int write_file(const char* path, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    unsigned char buf[65536];
    for (size_t done = 0; done < size;) {
        size_t n = size - done < sizeof buf ? size - done : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = pattern_byte(done + i);
        if (write(fd, buf, n) != (ssize_t)n) {
            close(fd);
            return -1;
        }
        done += n;
    }
    return close(fd);
}

static int same_bytes(const unsigned char* p, size_t size) {
    for (size_t i = 0; i < size; i++)
        if (p[i] != pattern_byte(i)) return 0;
    return 1;
}

/* One load of path; returns its CheckpointMap's huge_bytes and recached through the pointers. */
static void load_once(const char* path, size_t size, int copy, long long* huge, int* recached) {
    int fd = open(path, O_RDONLY);
    CheckpointMap m;
    int err = checkpoint_map(&m, fd, size, copy);
    close(fd);
    check(err == 0, "checkpoint_map succeeds", size);
    if (err != 0) return;
    check(m.size == size, "size is the file's", size);
    check(m.copied == (copy != 0), "copied says how it was loaded", size);
    check(same_bytes(m.data, size), "the bytes are the file's", size);
    check((uintptr_t)m.data % MB2 == 0, "the data starts on a 2 MB boundary", size);
    if (!copy) check(m.huge_bytes >= -1 && m.huge_bytes <= (long long)size, "huge_bytes in range", size);
    if (huge) *huge = m.huge_bytes;
    if (recached) *recached = m.recached;
    checkpoint_unmap(&m);
    check(m.data == NULL, "unmap clears the map", size);
}

int main(void) {
    char dir[] = "/tmp/test_checkpoint_map.XXXXXX";
    if (mkdtemp(dir) == NULL) {
        printf("cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    const size_t sizes[] = {1, 4096, MB2 - 1, MB2, 3 * MB2 + 12345, 24 * MB2};
    char path[64];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t size = sizes[k];
        if (write_file(path, size) != 0) {
            printf("cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        long long huge1 = -1, huge2 = -1;
        int recached1 = 0, recached2 = 0;
        load_once(path, size, 0, &huge1, &recached1);
        load_once(path, size, 0, &huge2, &recached2);
        load_once(path, size, 1, NULL, NULL);
        size_t whole = size / MB2 * MB2;
        if (recached1) {
            check(!recached2, "a second load does not refill the cache again", size);
            check(huge2 >= (long long)(whole - whole / 100), "after a refill, 2 MB pages", size);
        }
        printf("%10zu bytes: mapped in 2 MB pages: first load %lld bytes%s, second %lld bytes%s\n",
               size, huge1, recached1 ? " (cache refilled)" : "", huge2,
               recached2 ? " (cache refilled)" : "");
    }
    unlink(path);
    rmdir(dir);

    CheckpointMap m;
    check(checkpoint_map(&m, -1, 4096, 0) != 0, "a bad descriptor is an error", 4096);
    check(checkpoint_map(&m, -1, 4096, 1) != 0, "a bad descriptor is an error (copy)", 4096);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
