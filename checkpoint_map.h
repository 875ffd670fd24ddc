/* checkpoint_map.h: the checkpoint file in memory, mapped in 2 MB pages where the OS allows it.
 *
 * Why this is its own job: on Linux a file mapping is served from the page cache, and how fast the
 * weights stream during decode depends on the page size the cache holds them in: on some virtual
 * machines a mapping of 4 KB pages reads several times slower than the same file in 2 MB pages
 * (docs/design.md#mapped-weights). */
#ifndef CHECKPOINT_MAP_H
#define CHECKPOINT_MAP_H

#include <stddef.h>

typedef struct {
    void* data;          /* the file's bytes: a read-only mapping, or a heap copy (copied = 1) */
    size_t size;         /* the file's size in bytes */
    int copied;          /* 1: read into 2 MB-aligned anonymous memory (--no-mmap), not mapped */
    long long huge_bytes;  /* bytes of the mapping in 2 MB pages after loading, from
                            * /proc/self/smaps (FilePmdMapped); -1 where that cannot be read
                            * and for a copy */
    int recached;        /* 1: the page cache held the file in small pages, so it was written back,
                          * dropped and read again in 2 MB pages */
} CheckpointMap;

/* Maps the open file fd of size bytes. Linux: the mapping starts on a 2 MB boundary, is marked
 * MADV_HUGEPAGE (page cache misses are read in as 2 MB folios) and populated now, so the first
 * forward pass does not fault page by page; when the cache already held more than 1% of the file
 * in small pages (it was just written, copied or read with read()), those are dropped once and
 * read again. Other systems: a plain mmap. copy != 0 (--no-mmap): no mapping; the file is read
 * (pread, 64 MB at a time) into 2 MB-aligned anonymous memory marked for huge pages, so the process
 * holds one copy of it.
 * Returns 0, or an errno value. */
int checkpoint_map(CheckpointMap* m, int fd, size_t size, int copy);
void checkpoint_unmap(CheckpointMap* m);

/* size bytes of anonymous memory, 2 MB aligned and marked for transparent huge pages (free with
 * free()): where --no-mmap copies the file, and the bench's read buffer, so that the roof is read
 * under the same paging as the weights. NULL with errno set on failure. */
void* alloc_huge_anonymous(size_t size);

#endif
