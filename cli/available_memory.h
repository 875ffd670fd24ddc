/* available_memory.h: how many bytes of a model's file memory can hold for this process, so that
 * ./run reads a file whole at load only where it fits (docs/design.md#mapped-weights). */
#ifndef AVAILABLE_MEMORY_H
#define AVAILABLE_MEMORY_H

#include <stddef.h>

/* The kernel's MemAvailable (/proc/meminfo: free memory plus what it can reclaim, the page cache
 * included, so a file's own cached pages count as room for it), lowered to the memory limit of
 * this process's cgroup and of each cgroup above it (v2 memory.max, v1 memory.limit_in_bytes),
 * where one is set. -1 where neither can be read (not Linux). */
long long available_memory(void);

/* The parts, on the files' text (the tests give them their own). */
long long meminfo_available(const char* meminfo);   /* MemAvailable in bytes, or -1 */
long long cgroup_limit_value(const char* limit);    /* bytes, or -1 for "max", v1's unlimited, junk */
/* The memory cgroup's folder from /proc/self/cgroup's text ("0::/a/b" under v2, "N:...memory...:/a/b"
 * under v1): "/sys/fs/cgroup/a/b" or "/sys/fs/cgroup/memory/a/b" in dir, the v1 one where a
 * memory line is there; *v1 says which. 0, or -1 with neither. */
int cgroup_memory_dir(const char* self_cgroup, char* dir, size_t len, int* v1);

#endif
