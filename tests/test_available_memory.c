/* tests/test_available_memory.c: the room ./run finds for a model's file (cli/available_memory.h),
 * read from the texts of /proc/meminfo, a cgroup's limit file and /proc/self/cgroup as Linux
 * writes them under cgroup v1 and v2, and once from this machine's own files. Whether ./run then
 * reads a larger file as it goes is tests/test_large_model.py's. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "cli/available_memory.h"

static void test_meminfo(void) {
    const char* meminfo = "MemTotal:       24684084 kB\nMemFree:        17745944 kB\n"
                          "MemAvailable:   24212540 kB\nBuffers:           15672 kB\n";
    check(meminfo_available(meminfo) == 24212540LL * 1024, "MemAvailable in bytes");
    check(meminfo_available("MemTotal:       24684084 kB\nMemFree:        17745944 kB\n") == -1,
          "a kernel without MemAvailable: -1");
    check(meminfo_available("XMemAvailable: 5 kB\n") == -1, "only a line that starts with MemAvailable counts");
    check(meminfo_available("") == -1, "an empty text: -1");
}

static void test_limit_values(void) {
    check(cgroup_limit_value("4294967296\n") == 4294967296LL, "a limit in bytes");
    check(cgroup_limit_value("max\n") == -1, "v2's max: no limit");
    check(cgroup_limit_value("9223372036854771712\n") == -1, "v1's unlimited: no limit");
    check(cgroup_limit_value("") == -1 && cgroup_limit_value("0\n") == -1, "empty or zero: no limit");
}

static void test_cgroup_dirs(void) {
    char dir[256];
    int v1 = -1;
    check(cgroup_memory_dir("0::/user.slice/session-1.scope\n", dir, sizeof dir, &v1) == 0 && v1 == 0 &&
              strcmp(dir, "/sys/fs/cgroup/user.slice/session-1.scope") == 0,
          "v2: the unified hierarchy's folder");
    v1 = -1;
    check(cgroup_memory_dir("12:pids:/a\n7:memory:/lim\n1:name=systemd:/b\n0::/c\n", dir, sizeof dir, &v1) == 0 &&
              v1 == 1 && strcmp(dir, "/sys/fs/cgroup/memory/lim") == 0,
          "v1 beside v2 (hybrid): the memory controller's folder");
    v1 = -1;
    check(cgroup_memory_dir("4:cpu,memory:/x/y", dir, sizeof dir, &v1) == 0 && v1 == 1 &&
              strcmp(dir, "/sys/fs/cgroup/memory/x/y") == 0,
          "v1: memory among several controllers, no newline at the end");
    check(cgroup_memory_dir("4:cpuacct,cpu:/a\n3:memoryx:/b\n", dir, sizeof dir, &v1) == -1,
          "no memory controller and no v2 line: -1");
    check(cgroup_memory_dir("", dir, sizeof dir, &v1) == -1, "an empty text: -1");
    char small[16];
    check(cgroup_memory_dir("0::/a/long/path/to/a/group\n", small, sizeof small, &v1) == -1, "a folder too long: -1");
}

/* On Linux the room is there and no larger than MemAvailable. */
static void test_this_machine(void) {
    char text[8192];
    FILE* f = fopen("/proc/meminfo", "r");
    if (f == NULL) {
        printf("  this machine's room not checked: no /proc/meminfo here\n");
        return;
    }
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    const long long room = available_memory(), meminfo = meminfo_available(text);
    check(room > 0 && (meminfo < 0 || room <= meminfo), "available_memory: above 0, at most MemAvailable");
    printf("  this machine: %.2f GB available to this process (MemAvailable %.2f GB)\n", room / 1e9, meminfo / 1e9);
}

int main(void) {
    test_meminfo();
    test_limit_values();
    test_cgroup_dirs();
    test_this_machine();
    return checks_done();
}
