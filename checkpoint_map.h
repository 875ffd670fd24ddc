/* checkpoint_map.h: the checkpoint file in memory: mapped read-only (in 2 MB pages where the page
 * cache holds it so), or read into memory with --no-mmap.
 *
 * Why this is its own job: on Linux a file mapping is served from the page cache, and how fast the
 * weights stream during decode depends on the page size the cache holds them in: on some virtual
 * machines a mapping of 4 KB pages reads several times slower than the same file in 2 MB pages
 * (docs/design.md#mapped-weights). By default a load only maps and reads the file; the one step
 * that changes the system's page cache, the refill, runs only when asked for
 * (docs/design.md#page-cache-repair). */
#ifndef CHECKPOINT_MAP_H
#define CHECKPOINT_MAP_H

#include <stddef.h>

typedef struct {
    void* data;          /* the file's bytes: a read-only mapping, or a heap copy (copied = 1) */
    size_t size;         /* the file's size in bytes */
    int copied;          /* 1: read into 2 MB-aligned anonymous memory (--no-mmap), not mapped */
    int refilled;        /* 1: asked to refill (--refill-page-cache), the loader found the file in
                          * small pages and dropped and read it again in 2 MB pages */
} CheckpointMap;

/* How checkpoint_map loads the file. */
enum {
    CHECKPOINT_MAPPED = 0,  /* the default: map it, no change to the system's page cache */
    CHECKPOINT_COPIED = 1,  /* --no-mmap: read it into the process's own memory */
    CHECKPOINT_REFILL = 2,  /* --refill-page-cache: map it; where the page cache holds it in small
                             * pages, write back, drop and read again the file's cached pages */
};

/* Maps the open file fd of size bytes, as `how` says.
 * CHECKPOINT_MAPPED, Linux: the mapping starts on a 2 MB boundary, is marked MADV_HUGEPAGE (page
 * cache misses are read in as 2 MB folios) and populated now, so the first forward pass does not
 * fault page by page; pages the cache already holds are mapped as they are. Other systems: a
 * plain mmap.
 * CHECKPOINT_REFILL: the same, then, where more than 1% of the file is in small pages, the file is
 * written back, dropped from the page cache (for every process on the system) and read again,
 * after a 2 MB probe shows that this system gives file mappings 2 MB pages.
 * CHECKPOINT_COPIED: no mapping; the file is read into 2 MB-aligned anonymous memory marked for
 * huge pages. Returns 0, or an errno value. */
int checkpoint_map(CheckpointMap* m, int fd, size_t size, int how);
void checkpoint_unmap(CheckpointMap* m);

/* Bytes of m's mapping in 2 MB pages now (FilePmdMapped in /proc/self/smaps: one read of that
 * file, a few milliseconds); -1 for a copy and where smaps cannot tell. For measuring tools (the
 * bench): a load never asks. */
long long checkpoint_map_huge_bytes(const CheckpointMap* m);

/* size bytes of anonymous memory, 2 MB aligned and marked for transparent huge pages (free with
 * free()): where --no-mmap copies the file, and the bench's read buffer, so that the roof is read
 * under the same paging as the weights. NULL with errno set on failure. */
void* alloc_huge_anonymous(size_t size);

#endif
