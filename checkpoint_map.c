/* checkpoint_map.c: the checkpoint file in memory, mapped in 2 MB pages where the OS allows it.
 *
 * Decode reads every weight once per token, so the weights' page size decides how much address
 * translation each gigabyte costs (docs/design.md#mapped-weights). Anonymous memory gets
 * transparent huge pages; a file mapping gets whatever folio size the page cache holds the file
 * in. On Linux 6.x a mapping marked MADV_HUGEPAGE reads page cache misses in as 2 MB folios
 * (mm/filemap.c, do_sync_mmap_readahead) and maps such folios with one page-table entry each when
 * the address and the file offset agree modulo 2 MB. A file that was just written, copied or read
 * with read() sits in the cache in small folios instead, and a default load maps it so: the page
 * cache is shared by every process, so changing it is left to the user (CHECKPOINT_REFILL). */
#include "checkpoint_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

void* alloc_huge_anonymous(size_t size) {
    size_t alloc = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void* buf = NULL;
    if (posix_memalign(&buf, HUGE_PAGE, alloc) != 0) {
        errno = ENOMEM;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(buf, alloc, MADV_HUGEPAGE); /* a hint; without THP the memory still works */
#endif
    return buf;
}

/* --no-mmap keeps the file in such memory, read with pread(2) straight into it: the process holds
 * one copy of the file, where copying from a mapping would hold two at the peak. */
static void* read_whole_file(int fd, size_t size) {
    void* buf = alloc_huge_anonymous(size);
    if (buf == NULL) return NULL;
    for (size_t done = 0; done < size;) {
        size_t chunk = size - done < ((size_t)64 << 20) ? size - done : ((size_t)64 << 20);
        ssize_t got = pread(fd, (char*)buf + done, chunk, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) { /* 0: the file became shorter than its size */
            int e = got < 0 ? errno : EIO;
            free(buf);
            errno = e;
            return NULL;
        }
        done += (size_t)got;
    }
    return buf;
}

/* mmap(fd) read-only at an address that is a multiple of 2 MB (a 2 MB page can only back a 2 MB
 * aligned stretch of addresses that maps a 2 MB aligned stretch of the file, which starts at
 * offset 0 here): reserve size + 2 MB, map the file over the first aligned address, give back the
 * rest of the reservation. Returns MAP_FAILED with errno set on failure. */
static void* map_aligned(int fd, size_t size) {
    char* area = mmap(NULL, size + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return MAP_FAILED;
    char* start = (char*)(((uintptr_t)area + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    void* p = mmap(start, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(area, size + HUGE_PAGE);
        errno = e;
        return MAP_FAILED;
    }
    /* Both lengths round up to whole pages, and HUGE_PAGE is a whole number of pages, so the
     * reservation's tail past the mapping is HUGE_PAGE - (start - area) long. */
    size_t head = (size_t)(start - area), page = (size_t)sysconf(_SC_PAGESIZE);
    if (head > 0) munmap(area, head);
    munmap(start + (size + page - 1) / page * page, HUGE_PAGE - head); /* never empty: head < 2 MB */
    return p;
}

/* Faults in [p, p + n) now rather than page by page in the first forward pass. */
static void populate(const char* p, size_t n) {
#ifdef MADV_POPULATE_READ
    if (madvise((void*)p, n, MADV_POPULATE_READ) == 0) return;
#endif
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile char sink = 0;
    for (size_t i = 0; i < n; i += page) sink ^= p[i];
    (void)sink;
}

/* Bytes of the mapping that starts at `start` backed by 2 MB file pages (smaps' FilePmdMapped),
 * or -1 where /proc/self/smaps cannot tell. */
static long long file_pmd_bytes(const void* start) {
    FILE* f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return -1;
    char line[4096];
    int ours = 0;
    long long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        /* A mapping's header line is "lo-hi perms ..."; its field lines are "Name: value kB". */
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            if (ours) break;
            ours = lo == (unsigned long)(uintptr_t)start;
        } else if (ours && sscanf(line, "FilePmdMapped: %lld kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

long long checkpoint_map_huge_bytes(const CheckpointMap* m) {
    if (m->data == NULL || m->copied) return -1;
    return file_pmd_bytes(m->data);
}

/* CHECKPOINT_REFILL (docs/design.md#page-cache-repair): p maps fd populated; where more than 1% of
 * the whole 2 MB stretches are in small pages, the cache held the file, or parts of it, in small
 * folios, which decode reads far slower on some VMs. First a probe, so that a system that cannot
 * give file mappings 2 MB pages (a filesystem without large folios, an older kernel) pays one 2 MB
 * re-read and not the whole file: drop [2 MB, 4 MB) of the cache, map again, and see whether it
 * came back as one 2 MB page. If so, drop the rest too (fdatasync first: dirty pages cannot be
 * dropped). Both drops act on the system's page cache, for every process that reads the file.
 * Returns the mapping to use (p, or a new one), MAP_FAILED with errno set on failure. */
static char* refill_page_cache(int fd, char* p, size_t size, int* refilled) {
#if defined(MADV_HUGEPAGE) && defined(POSIX_FADV_DONTNEED)
    const size_t whole = size / HUGE_PAGE * HUGE_PAGE; /* the most 2 MB pages can cover */
    long long huge = file_pmd_bytes(p);
    if (huge < 0 || (size_t)huge >= whole - whole / 100 || size < 2 * HUGE_PAGE) return p;
    munmap(p, size);
    fdatasync(fd);
    posix_fadvise(fd, (off_t)HUGE_PAGE, (off_t)HUGE_PAGE, POSIX_FADV_DONTNEED);
    p = map_aligned(fd, size);
    if (p == MAP_FAILED) return p;
    madvise(p, size, MADV_HUGEPAGE);
    populate(p + HUGE_PAGE, HUGE_PAGE);
    if (file_pmd_bytes(p) >= (long long)HUGE_PAGE) {
        /* Pages we have mapped stay; the rest of the file is not mapped by us yet. */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        *refilled = 1;
    }
    populate(p, size);
#endif
    return p;
}

int checkpoint_map(CheckpointMap* m, int fd, size_t size, int how) {
    memset(m, 0, sizeof *m);
    m->size = size;
    if (how == CHECKPOINT_COPIED) {
        m->data = read_whole_file(fd, size);
        if (m->data == NULL) return errno;
        m->copied = 1;
        return 0;
    }
    char* p = map_aligned(fd, size);
    if (p == MAP_FAILED) return errno;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE); /* a hint: EINVAL without THP is fine */
#endif
    populate(p, size);
    if (how == CHECKPOINT_REFILL) p = refill_page_cache(fd, p, size, &m->refilled);
    if (p == MAP_FAILED) return errno;
    m->data = p;
    return 0;
}

void checkpoint_unmap(CheckpointMap* m) {
    if (m->data == NULL) return;
    if (m->copied) free(m->data);
    else munmap(m->data, m->size);
    memset(m, 0, sizeof *m);
}
