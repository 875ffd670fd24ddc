/* threads.c: the kernel threads. A small pthread pool behind parallel_for: n_threads - 1 workers plus
 * the calling thread. Items are claimed one at a time, so a thread that is slow (descheduled,
 * sharing its core with another process) simply takes fewer items.
 *
 * See the comment at P below for how a dispatch is handed out.
 *
 * Waiting: a worker that finds no work spins for a short, bounded time (KERNELS_SPIN_US, default
 * below; not at all while the threads wait for a core that another process holds, see
 * spin_limit_ns) with a pause instruction, then sleeps on a condition variable; the dispatching
 * thread does the same while it waits for the last worker. Decode issues a few hundred dispatches
 * per token, microseconds apart, so the spin saves a futex wake-up per dispatch; between tokens and
 * when idle every thread sleeps. While another process competes for the cores (the same run-delay
 * test), parallel_for does not dispatch at all: the calling thread runs every item itself. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "simd_math.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_THREADS 256
#define DEFAULT_SPIN_US 200
#define CONTENTION_CHECK_NS 50000000L  /* each thread looks at its run delay at most every 50 ms */
#define CONTENTION_DELAY_PCT 20        /* runnable but not running for over 20% of that time */
#define CONTENTION_LOOKS 2             /* in two looks in a row: */
#define CONTENTION_HOLD_NS 1000000000L /* stop spinning (and dispatching) for 1 s, */
#define CONTENTION_HOLD_MAX_NS 4000000000L /* doubled up to 4 s while the contention persists */

typedef void (*ItemFn)(void*, int);

/* The current dispatch: `word` packs its generation (high 32 bits) and the next unclaimed item
 * (low 32 bits). A thread claims item i of generation g by a compare-and-swap (g, i) -> (g, i+1),
 * so an item is only ever run for the dispatch it belongs to, and the dispatching thread waits for
 * the items to be *done*, not for every worker to show up: a worker that is descheduled (its core
 * busy with another process) when a dispatch starts does not hold it up; the others take its share. */
static struct {
    int n_threads;
    int max_threads;            /* kernels_init's count: the callers' per-thread scratch is sized for it */
    int started;                /* workers running */
    pthread_t th[MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    _Atomic(ItemFn) fn;
    _Atomic(void*) ctx;
    atomic_int n;
    _Atomic uint64_t word;
    atomic_int done;            /* items of the current dispatch finished */
    atomic_int quit;
    atomic_int caller_waiting;
    int sleepers;               /* workers in cond_wait (under mu) */
    long spin_ns;
} P = {.n_threads = 1, .max_threads = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv_work = PTHREAD_COND_INITIALIZER,
       .cv_done = PTHREAD_COND_INITIALIZER};

static _Thread_local int in_worker;  /* nested parallel_for runs serially */
static _Thread_local int alone;      /* parallel_for runs the current dispatch on this thread only */
static _Thread_local int thread_index; /* 0: the calling thread; worker i: i + 1 */

int kernels_thread_index(void) { return thread_index; }

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> 32); }

/* How long to spin before sleeping. Spinning pays only while every kernel thread has a core of
 * its own: it saves a futex wake-up per dispatch. When another process wants a core, a spinning
 * thread burns the share of CPU that the thread it waits for needs, and two threads become slower
 * than one. The sign of that is time spent runnable but not running, which Linux counts per thread
 * (the second field of /proc/thread-self/schedstat, the run delay); counting preemptions does not
 * work, since a virtual machine can preempt each thread about once per 10 ms even when quiet. So
 * each thread reads its run delay at most every CONTENTION_CHECK_NS, and growth above
 * CONTENTION_DELAY_PCT of the wall time since the last look, in CONTENTION_LOOKS looks in a row
 * (one look can be a kernel thread taking the core for a few milliseconds), stops spinning (and
 * dispatching, see parallel_for) for every thread for CONTENTION_HOLD_NS; when that has passed, the
 * next dispatches run on all threads again and measure anew. That probe costs: until the looks
 * see the delay again, every dispatch waits for a thread that shares its core with the neighbour.
 * So a hold's end first asks the CPU counters (/proc/stat, the idle time of the CPUs this process
 * may run on) whether the cores were free during the hold, while only the calling thread ran: if
 * the idle share leaves less than half a core per worker thread, another process kept them busy,
 * and a new hold starts without a probe (cores_were_busy). Only when they were free (or the
 * counters cannot be read) do the dispatches resume and the run delay decide: a probe that finds
 * the contention still there makes the next hold twice as long, up to CONTENTION_HOLD_MAX_NS, and
 * a hold that starts later begins again from CONTENTION_HOLD_NS.
 * Where the schedstat file does not exist (not Linux), the threads always spin and dispatch.
 * The measurements behind each number: docs/design.md#contention. */
static atomic_long contended_until;              /* no spinning or dispatching before this */
static atomic_long hold_ns = CONTENTION_HOLD_NS;  /* the length of the next hold */
static atomic_int hold_unchecked;                /* 1 from a hold's start until its end is looked at */
static _Atomic long long hold_idle = -1, hold_total; /* cpu_ticks at the hold's start */

/* The idle (idle + iowait) and total clock ticks, summed over the CPUs this process may run on,
 * from the "cpuN" lines of /proc/stat, and how many CPUs that is; -1 where they cannot be read. */
static long long cpu_ticks(long long* total, int* n_cpus) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    FILE* f = fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[512];
    long long idle = 0, all = 0;
    int n = 0;
    while (fgets(line, sizeof line, f) && strncmp(line, "cpu", 3) == 0) {
        char* p = line + 3;
        if (*p < '0' || *p > '9') continue; /* the "cpu" line: every CPU together */
        const long cpu = strtol(p, &p, 10);
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET((int)cpu, &set)) continue;
        long long v[8] = {0}; /* user nice system idle iowait irq softirq steal */
        for (int k = 0; k < 8; k++) v[k] = strtoll(p, &p, 10);
        idle += v[3] + v[4];
        for (int k = 0; k < 8; k++) all += v[k];
        n++;
    }
    fclose(f);
    if (n == 0) return -1;
    *total = all;
    *n_cpus = n;
    return idle;
}

static void start_hold(long t, long h) {
    long long total = 0;
    int n = 0;
    atomic_store(&hold_idle, cpu_ticks(&total, &n));
    atomic_store(&hold_total, total);
    atomic_store(&hold_ns, h);
    atomic_store(&contended_until, t + h);
    atomic_store(&hold_unchecked, 1);
}

/* Whether another process kept the cores busy during the hold that just ended (see above). */
static int cores_were_busy(void) {
    long long total = 0, t0 = atomic_load(&hold_total), i0 = atomic_load(&hold_idle);
    int n = 0;
    const long long idle = cpu_ticks(&total, &n);
    if (idle < 0 || i0 < 0 || total - t0 < 20LL * n) return 0; /* unknown, or under 20 ticks (0.2 s) */
    const double spare_cpus = (double)(idle - i0) / (double)(total - t0) * n;
    return spare_cpus < 0.5 * (P.n_threads - 1);
}

static _Thread_local long last_check_ns;
static _Thread_local long long last_delay_ns;
static _Thread_local int delayed_looks; /* looks in a row that saw the run delay above the mark */
static _Thread_local int schedstat_fd = -2;  /* -2: not opened yet, -1: not available */

static long long run_delay_ns(void) {
    if (schedstat_fd == -2) schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (schedstat_fd < 0) return -1;
    char buf[96];
    ssize_t k = pread(schedstat_fd, buf, sizeof buf - 1, 0);
    if (k <= 0) return -1;
    buf[k] = '\0';
    char* p = buf;
    strtoull(p, &p, 10);              /* time on the CPU */
    return (long long)strtoull(p, NULL, 10); /* time waiting on a run queue */
}

static void close_schedstat(void) {
    if (schedstat_fd >= 0) close(schedstat_fd);
    schedstat_fd = -2;
}

/* 1 while another process competes for the cores (see above). */
static int contended(void) {
    long t = now_ns();
    if (t >= atomic_load(&contended_until) && atomic_exchange(&hold_unchecked, 0) && cores_were_busy())
        start_hold(t, CONTENTION_HOLD_NS); /* still busy: hold on, without a probe */
    if (t - last_check_ns > CONTENTION_CHECK_NS) {
        long long d = run_delay_ns();
        if (d >= 0) {
            const int delayed = last_check_ns != 0 &&
                                (d - last_delay_ns) * 100 > (long long)(t - last_check_ns) * CONTENTION_DELAY_PCT;
            delayed_looks = delayed ? delayed_looks + 1 : 0;
            if (delayed_looks >= CONTENTION_LOOKS) {
                long until = atomic_load(&contended_until), h = atomic_load(&hold_ns);
                if (t >= until) /* a new hold: after a probe (a hold that just ended) twice as long */
                    h = until != 0 && t - until < 3 * CONTENTION_CHECK_NS
                            ? (2 * h < CONTENTION_HOLD_MAX_NS ? 2 * h : CONTENTION_HOLD_MAX_NS)
                            : CONTENTION_HOLD_NS;
                start_hold(t, h);
            }
            last_delay_ns = d;
        }
        last_check_ns = t;
    }
    return t < atomic_load(&contended_until);
}

static long spin_limit_ns(void) {
    if (P.spin_ns == 0) return 0;
    return contended() ? 0 : P.spin_ns;
}

/* The item number of a dispatch that is being set up: no item can be claimed. parallel_for closes
 * the previous dispatch with it before it changes fn/ctx/n, so a worker that read the old word and
 * then the new parameters can never claim an item with them: its compare-and-swap expects the old
 * word. (Without this, a worker could claim item n_old of the finished dispatch while the new
 * parameters were being written, run the new fn on it and count it as done: an index run twice,
 * which tests/test_kernels.c's parallel_for rounds look for.) */
#define CLOSED 0x7FFFFFFFu

static void run_items(uint32_t g) {
    for (;;) {
        uint64_t w = atomic_load(&P.word);
        if (gen_of(w) != g) return;
        if ((uint32_t)w == CLOSED) { /* being set up: opened a few stores from now */
            CPU_RELAX();
            continue;
        }
        int i = (int)(uint32_t)w;
        int n = atomic_load(&P.n);
        ItemFn fn = atomic_load(&P.fn);
        void* ctx = atomic_load(&P.ctx);
        if (i >= n) return;
        /* Success means generation g was still open with item i unclaimed, so fn/ctx/n (read above,
         * all seq_cst) are g's: they are only written while the word says CLOSED. */
        if (!atomic_compare_exchange_weak(&P.word, &w, w + 1)) continue;
        fn(ctx, i);
        if (atomic_fetch_add(&P.done, 1) + 1 == n && atomic_load(&P.caller_waiting)) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.cv_done);
            pthread_mutex_unlock(&P.mu);
        }
    }
}

static void* worker_main(void* arg) {
    thread_index = (int)(intptr_t)arg;
    in_worker = 1;
    uint32_t seen = gen_of(atomic_load(&P.word));
    for (;;) {
        uint32_t g = gen_of(atomic_load_explicit(&P.word, memory_order_acquire));
        long spin = g == seen ? spin_limit_ns() : 0;
        if (spin > 0) {
            long t0 = now_ns();
            for (int k = 0; g == seen; k++) {
                CPU_RELAX();
                g = gen_of(atomic_load_explicit(&P.word, memory_order_acquire));
                if ((k & 63) == 63 && now_ns() - t0 > spin) break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&P.mu);
            P.sleepers++;
            while ((g = gen_of(atomic_load(&P.word))) == seen && !atomic_load(&P.quit))
                pthread_cond_wait(&P.cv_work, &P.mu);
            P.sleepers--;
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.quit)) break;
        seen = g;
        run_items(g);
    }
    close_schedstat();
    return NULL;
}

void parallel_for(int n, void (*fn)(void* ctx, int i), void* ctx) {
    if (n <= 0) return;
    /* Serially in the calling thread: no workers, a single item, a nested call, or another
     * process competing for the cores. In the last case a worker that the scheduler takes off its
     * core in the middle of an item holds up the whole dispatch until it runs again, and with a
     * few hundred dispatches per decoded token two threads would be slower than one
     * (docs/design.md#contention). */
    if (P.started == 0 || n == 1 || in_worker || contended()) {
        const int outer = alone;
        if (!in_worker) alone = 1; /* a nested call inherits the dispatch it runs in */
        for (int i = 0; i < n; i++) fn(ctx, i);
        alone = outer;
        return;
    }
    uint32_t g = gen_of(atomic_load(&P.word)) + 1;
    atomic_store(&P.word, ((uint64_t)g << 32) | CLOSED);
    atomic_store(&P.fn, fn);
    atomic_store(&P.ctx, ctx);
    atomic_store(&P.n, n);
    atomic_store(&P.done, 0);
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.word, (uint64_t)g << 32);
    if (P.sleepers > 0) pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);

    in_worker = 1;
    run_items(g);
    in_worker = 0;

    if (atomic_load(&P.done) < n) {
        long spin = spin_limit_ns();
        long t0 = now_ns();
        for (int k = 0; atomic_load(&P.done) < n; k++) {
            if (k > 0) CPU_RELAX();
            if (spin == 0 || ((k & 63) == 63 && now_ns() - t0 > spin)) {
                pthread_mutex_lock(&P.mu);
                atomic_store(&P.caller_waiting, 1);
                while (atomic_load(&P.done) < n) pthread_cond_wait(&P.cv_done, &P.mu);
                atomic_store(&P.caller_waiting, 0);
                pthread_mutex_unlock(&P.mu);
                break;
            }
        }
    }
}

/* parallel_spans: one contiguous part of [0, n) per thread, cut at multiples of align. */
typedef struct {
    void (*fn)(void* ctx, int begin, int end);
    void* ctx;
    int n, align, parts;
} Spans;

static void span_item(void* ctx, int part) {
    const Spans* s = ctx;
    const long long blocks = (s->n + s->align - 1) / s->align;
    const int begin = (int)(blocks * part / s->parts) * s->align;
    int end = (int)(blocks * (part + 1) / s->parts) * s->align;
    if (end > s->n) end = s->n;
    if (end > begin) s->fn(s->ctx, begin, end);
}

void parallel_spans(int n, int align, int spread, void (*fn)(void* ctx, int begin, int end), void* ctx) {
    Spans s = {fn, ctx, n, align > 0 ? align : 1, spread ? P.n_threads : 1};
    parallel_for(s.parts, span_item, &s);
}

static void pool_stop(void) {
    if (P.started == 0) return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.quit, 1);
    atomic_store(&P.word, ((uint64_t)(gen_of(atomic_load(&P.word)) + 1) << 32) | CLOSED);
    pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.started; i++) pthread_join(P.th[i], NULL);
    P.started = 0;
    atomic_store(&P.quit, 0);
}

/* n_threads - 1 workers (fewer if the system refuses a thread). */
static void pool_start(int n_threads) {
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&P.th[i], NULL, worker_main, (void*)(intptr_t)(i + 1)) != 0) break;
        P.started++;
    }
    P.n_threads = P.started + 1;
}

/* KERNELS_SPIN_US: microseconds a waiting thread spins before it sleeps; a value that is not a
 * whole number >= 0 is reported and the default kept. */
static long spin_us_from_env(void) {
    const char* s = getenv("KERNELS_SPIN_US");
    if (!s || !*s) return DEFAULT_SPIN_US;
    char* end;
    const long us = strtol(s, &end, 10);
    if (*end != '\0' || us < 0 || us > 1000000) {
        fprintf(stderr, "warning: KERNELS_SPIN_US=%s is not a whole number of microseconds (0 to 1000000); using %d\n",
                s, DEFAULT_SPIN_US);
        return DEFAULT_SPIN_US;
    }
    return us;
}

/* The CPUs this process may run on (its affinity mask, e.g. under taskset or a container's
 * cpuset), else the online CPUs: the default thread count. */
int kernels_available_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

int kernels_init(int n_threads, int max_batch, int max_cols) {
    kernels_free();
    if (n_threads <= 0) n_threads = kernels_available_cpus();
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    P.spin_ns = spin_us_from_env() * 1000L;
    if (matmul_scratch_init(n_threads, max_batch, max_cols) != 0) return -1;
    pool_start(n_threads);
    P.max_threads = P.n_threads;
    return 0;
}

int kernels_set_threads(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > P.max_threads) n_threads = P.max_threads;
    if (n_threads != P.n_threads) {
        pool_stop();
        pool_start(n_threads);
    }
    return P.n_threads;
}

void kernels_free(void) {
    pool_stop();
    close_schedstat();
    matmul_scratch_free();
    P.n_threads = 1;
    P.max_threads = 1;
}

int kernels_threads(void) { return P.n_threads; }

int kernels_alone(void) { return P.started == 0 || alone; }

const char* kernels_simd_name(void) {
#if defined(KERNELS_AVX2) && defined(KERNELS_AVX512)
    return kernels_amx() ? "avx2+avx512+amx" : "avx2+avx512"; /* 512-bit prefill tiles, AMX q8/q4 prefill (matmul_amx.c) */
#elif defined(KERNELS_AVX2)
    return "avx2";
#elif defined(KERNELS_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
