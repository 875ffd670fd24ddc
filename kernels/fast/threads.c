/* threads.c: the kernel threads. A small pthread pool behind parallel_for: n_threads - 1 workers plus
 * the calling thread. A dispatch is (generation, next item) in one 64-bit word: a thread claims item
 * i of generation g by a compare-and-swap (g, i) -> (g, i + 1), so an item only ever runs for its
 * own dispatch, and the caller waits for the items to be done, not for every worker to show up: a
 * slow worker (descheduled, sharing its core with another process) simply takes fewer items.
 *
 * A thread with nothing to do (a worker between dispatches, the caller waiting for the last item)
 * spins for at most KERNELS_SPIN_US with a pause instruction, then sleeps on a condition variable:
 * decode issues about 140 dispatches per token, tens of microseconds apart, so the spin saves a
 * futex wake-up per dispatch (docs/design.md#thread-pool). While another process competes for the
 * cores (contended, below) nobody spins and parallel_for does not dispatch: the calling thread runs
 * every item itself. */
#include <pthread.h>
#include <sys/syscall.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/simd_math.h"
#include "kernels/fast/fast.h"

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

typedef void (*ItemFn)(void*, int, int);

/* One thread's looks at its own run delay (contended, below): thread i of a context uses slot i. */
typedef struct {
    long last_check_ns;
    long long last_delay_ns;
    int delayed_looks; /* looks in a row that saw the run delay above the mark */
    int fd;            /* /proc/thread-self/schedstat of thread tid; -1: none open */
    pid_t tid;         /* the calling thread may change between dispatches: its fd is reopened */
} DelayLook;

typedef struct {
    Kernels* k;
    int index; /* 1 .. max_threads - 1 */
} Worker;

/* A kernel context (kernels.h): its thread pool, its contention watch and its matmul scratch. */
struct Kernels {
    int n_threads;
    int max_threads;            /* kernels_new's count: the per-thread scratch is sized for it */
    int started;                /* workers running */
    pthread_t th[MAX_THREADS];
    Worker workers[MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    _Atomic(ItemFn) fn;
    _Atomic(void*) ctx;
    atomic_int n;
    _Atomic uint64_t word;      /* the dispatch's generation (high 32 bits) and next unclaimed item */
    atomic_int done;            /* items of the current dispatch finished */
    atomic_int quit;
    atomic_int caller_waiting;
    int sleepers;               /* workers in cond_wait (under mu) */
    long spin_ns;               /* KERNELS_SPIN_US, read at kernels_new */
    atomic_int busy;            /* a parallel_for of this context is running: a nested call runs serially */
    /* The contention watch (see contended below). */
    atomic_long contended_until;   /* no spinning or dispatching before this */
    atomic_long hold_ns;           /* the length of the next hold */
    atomic_int hold_unchecked;     /* 1 from a hold's start until its end is looked at */
    _Atomic long long hold_idle, hold_total; /* cpu_ticks at the hold's start */
    DelayLook looks[MAX_THREADS];
    MatmulScratch* scratch;
};

MatmulScratch* kernels_scratch(const Kernels* k) { return k->scratch; }

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> 32); }

/* The contention detector (docs/design.md#contention). Spinning pays only while every kernel
 * thread has a core of its own; when another process wants one, a spinning thread burns the CPU
 * that the thread it waits for needs, and a worker preempted mid-item holds up the dispatch: two
 * threads become slower than one. The sign is the run delay (time runnable but not running, the
 * second field of /proc/thread-self/schedstat); counting preemptions fails, since a virtual
 * machine preempts each thread about once per 10 ms even when quiet. Two looks in a row, since
 * one can be a kernel thread taking the core for a few milliseconds. After a hold the dispatches
 * resume as a probe, which costs while the neighbour is still there, so a hold's end first asks
 * /proc/stat whether the cores stayed busy (cores_were_busy) and, if so, holds on without one. A
 * probe that finds the contention still there doubles the next hold. Without the schedstat file
 * (not Linux) the threads always spin and dispatch. */

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
        long long v[8]; /* user nice system idle iowait irq softirq steal */
        for (int k = 0; k < 8; k++) {
            v[k] = strtoll(p, &p, 10);
            all += v[k];
        }
        idle += v[3] + v[4];
        n++;
    }
    fclose(f);
    *total = all;
    *n_cpus = n;
    return n > 0 ? idle : -1;
}

static void start_hold(Kernels* k, long t, long h) {
    long long total = 0;
    int n = 0;
    atomic_store(&k->hold_idle, cpu_ticks(&total, &n));
    atomic_store(&k->hold_total, total);
    atomic_store(&k->hold_ns, h);
    atomic_store(&k->contended_until, t + h);
    atomic_store(&k->hold_unchecked, 1);
}

/* Whether another process kept the cores busy during the hold that just ended: the idle share
 * left less than half a core per worker. */
static int cores_were_busy(const Kernels* k) {
    long long total = 0, t0 = atomic_load(&k->hold_total), i0 = atomic_load(&k->hold_idle);
    int n = 0;
    const long long idle = cpu_ticks(&total, &n);
    if (idle < 0 || i0 < 0 || total - t0 < 20LL * n) return 0; /* unknown, or under 20 ticks (0.2 s) */
    const double spare_cpus = (double)(idle - i0) / (double)(total - t0) * n;
    return spare_cpus < 0.5 * (k->n_threads - 1);
}

/* The calling thread's run delay in ns (its schedstat file, opened through look), -1 where unknown. */
static long long run_delay_ns(DelayLook* look) {
    const pid_t tid = (pid_t)syscall(SYS_gettid);
    if (look->tid != tid) {
        if (look->fd >= 0) close(look->fd);
        look->fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        look->tid = tid;
    }
    if (look->fd < 0) return -1;
    char buf[96];
    ssize_t got = pread(look->fd, buf, sizeof buf - 1, 0);
    if (got <= 0) return -1;
    buf[got] = '\0';
    char* p = buf;
    strtoull(p, &p, 10);              /* time on the CPU */
    return (long long)strtoull(p, NULL, 10); /* time waiting on a run queue */
}

static void close_look(DelayLook* look) {
    if (look->fd >= 0) close(look->fd);
    *look = (DelayLook){.fd = -1};
}

/* 1 while another process competes for k's cores (see above); thread: the caller's index in k. */
static int contended(Kernels* k, int thread) {
    DelayLook* look = &k->looks[thread];
    long t = now_ns();
    if (t >= atomic_load(&k->contended_until) && atomic_exchange(&k->hold_unchecked, 0) && cores_were_busy(k))
        start_hold(k, t, CONTENTION_HOLD_NS); /* still busy: hold on, without a probe */
    if (t - look->last_check_ns > CONTENTION_CHECK_NS) {
        long long d = run_delay_ns(look);
        if (d >= 0) {
            const int delayed = look->last_check_ns != 0 && (d - look->last_delay_ns) * 100 >
                                                               (long long)(t - look->last_check_ns) * CONTENTION_DELAY_PCT;
            look->delayed_looks = delayed ? look->delayed_looks + 1 : 0;
            if (look->delayed_looks >= CONTENTION_LOOKS) {
                long until = atomic_load(&k->contended_until), h = atomic_load(&k->hold_ns);
                if (t >= until) /* a new hold: after a probe (a hold that just ended) twice as long */
                    h = until != 0 && t - until < 3 * CONTENTION_CHECK_NS
                            ? (2 * h < CONTENTION_HOLD_MAX_NS ? 2 * h : CONTENTION_HOLD_MAX_NS)
                            : CONTENTION_HOLD_NS;
                start_hold(k, t, h);
            }
            look->last_delay_ns = d;
        }
        look->last_check_ns = t;
    }
    return t < atomic_load(&k->contended_until);
}

static long spin_limit_ns(Kernels* k, int thread) {
    return k->spin_ns == 0 || contended(k, thread) ? 0 : k->spin_ns;
}

/* The item number of a dispatch being set up: dispatch closes the word with it before it changes
 * fn/ctx/n, so a worker that read the old word and then the new parameters cannot claim an item
 * with them (its compare-and-swap expects the old word), run the new fn on item n_old and count it
 * done: an index run twice, which tests/test_kernels.c's parallel_for rounds look for. */
#define CLOSED 0x7FFFFFFFu

static void run_items(Kernels* k, uint32_t g, int thread) {
    for (;;) {
        uint64_t w = atomic_load(&k->word);
        if (gen_of(w) != g) return;
        if ((uint32_t)w == CLOSED) { /* being set up: opened a few stores from now */
            CPU_RELAX();
            continue;
        }
        int i = (int)(uint32_t)w;
        int n = atomic_load(&k->n);
        ItemFn fn = atomic_load(&k->fn);
        void* ctx = atomic_load(&k->ctx);
        if (i >= n) return;
        /* Success means generation g was still open with item i unclaimed, so fn/ctx/n (read above,
         * all seq_cst) are g's: they are only written while the word says CLOSED. */
        if (!atomic_compare_exchange_weak(&k->word, &w, w + 1)) continue;
        fn(ctx, i, thread);
        if (atomic_fetch_add(&k->done, 1) + 1 == n && atomic_load(&k->caller_waiting)) {
            pthread_mutex_lock(&k->mu);
            pthread_cond_signal(&k->cv_done);
            pthread_mutex_unlock(&k->mu);
        }
    }
}

static void* worker_main(void* arg) {
    const Worker* me = arg;
    Kernels* k = me->k;
    const int thread = me->index;
    uint32_t seen = gen_of(atomic_load(&k->word));
    for (;;) {
        uint32_t g = gen_of(atomic_load_explicit(&k->word, memory_order_acquire));
        long spin = g == seen ? spin_limit_ns(k, thread) : 0;
        if (spin > 0) {
            long t0 = now_ns();
            for (int i = 0; g == seen; i++) {
                CPU_RELAX();
                g = gen_of(atomic_load_explicit(&k->word, memory_order_acquire));
                if ((i & 63) == 63 && now_ns() - t0 > spin) break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&k->mu);
            k->sleepers++;
            while ((g = gen_of(atomic_load(&k->word))) == seen && !atomic_load(&k->quit))
                pthread_cond_wait(&k->cv_work, &k->mu);
            k->sleepers--;
            pthread_mutex_unlock(&k->mu);
        }
        if (atomic_load(&k->quit)) break;
        seen = g;
        run_items(k, g, thread);
    }
    close_look(&k->looks[thread]);
    return NULL;
}

/* Hands items [0, n) to the workers and runs items on the calling thread too until all are done. */
static void dispatch(Kernels* k, int n, ItemFn fn, void* ctx) {
    uint32_t g = gen_of(atomic_load(&k->word)) + 1;
    atomic_store(&k->word, ((uint64_t)g << 32) | CLOSED);
    atomic_store(&k->fn, fn);
    atomic_store(&k->ctx, ctx);
    atomic_store(&k->n, n);
    atomic_store(&k->done, 0);
    pthread_mutex_lock(&k->mu);
    atomic_store(&k->word, (uint64_t)g << 32);
    if (k->sleepers > 0) pthread_cond_broadcast(&k->cv_work);
    pthread_mutex_unlock(&k->mu);

    run_items(k, g, 0);

    if (atomic_load(&k->done) >= n) return;
    const long spin = spin_limit_ns(k, 0), t0 = now_ns();
    for (int i = 0; spin > 0; i++) {
        if (atomic_load(&k->done) >= n) return;
        if ((i & 63) == 63 && now_ns() - t0 > spin) break;
        CPU_RELAX();
    }
    pthread_mutex_lock(&k->mu);
    atomic_store(&k->caller_waiting, 1);
    while (atomic_load(&k->done) < n) pthread_cond_wait(&k->cv_done, &k->mu);
    atomic_store(&k->caller_waiting, 0);
    pthread_mutex_unlock(&k->mu);
}

void parallel_for(Kernels* k, int n, void (*fn)(void* ctx, int i, int thread), void* ctx) {
    if (n <= 0) return;
    if (atomic_load(&k->busy)) { /* nested: from an item of k, on whichever thread of k runs it */
        int thread = 0; /* the caller, unless it is one of the workers */
        for (int i = 0; i < k->started; i++)
            if (pthread_equal(pthread_self(), k->th[i])) thread = i + 1;
        for (int i = 0; i < n; i++) fn(ctx, i, thread);
        return;
    }
    atomic_store(&k->busy, 1);
    if (k->started == 0 || n == 1 || contended(k, 0)) { /* serially in the calling thread */
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
    } else {
        dispatch(k, n, fn, ctx);
    }
    atomic_store(&k->busy, 0);
}

/* parallel_spans: one contiguous part of [0, n) per thread, cut at multiples of align. */
typedef struct {
    void (*fn)(void* ctx, int begin, int end);
    void* ctx;
    int n, align, parts;
} Spans;

static void span_item(void* ctx, int part, int thread) {
    const Spans* s = ctx;
    const long long blocks = (s->n + s->align - 1) / s->align;
    const int begin = (int)(blocks * part / s->parts) * s->align;
    int end = (int)(blocks * (part + 1) / s->parts) * s->align;
    if (end > s->n) end = s->n;
    if (end > begin) s->fn(s->ctx, begin, end);
}

void parallel_spans(Kernels* k, int n, int align, void (*fn)(void* ctx, int begin, int end), void* ctx) {
    Spans s = {fn, ctx, n, align > 0 ? align : 1, k->n_threads};
    parallel_for(k, s.parts, span_item, &s);
}

static void pool_stop(Kernels* k) {
    if (k->started == 0) return;
    pthread_mutex_lock(&k->mu);
    atomic_store(&k->quit, 1);
    atomic_store(&k->word, ((uint64_t)(gen_of(atomic_load(&k->word)) + 1) << 32) | CLOSED);
    pthread_cond_broadcast(&k->cv_work);
    pthread_mutex_unlock(&k->mu);
    for (int i = 0; i < k->started; i++) pthread_join(k->th[i], NULL);
    k->started = 0;
    atomic_store(&k->quit, 0);
}

/* n_threads - 1 workers (fewer if the system refuses a thread). The count is set before they start,
 * as they read it (cores_were_busy). They start with the asynchronous signals blocked, so that a
 * handler (Ctrl-C) runs on the caller's thread, which reads the flag it sets; the synchronous ones
 * (a bus error on the mapped file, say) stay with the thread that caused them. */
static void pool_start(Kernels* k, int n_threads) {
    k->n_threads = n_threads;
    sigset_t async, old;
    sigfillset(&async);
    const int synchronous[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++) sigdelset(&async, synchronous[i]);
    pthread_sigmask(SIG_BLOCK, &async, &old);
    for (int i = 0; i < n_threads - 1; i++) {
        k->workers[i] = (Worker){k, i + 1};
        if (pthread_create(&k->th[i], NULL, worker_main, &k->workers[i]) != 0) break;
        k->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (k->started + 1 < n_threads) { /* the system refused a thread: again with the count it gave */
        const int got = k->started + 1;
        pool_stop(k);
        pool_start(k, got);
    }
}

/* KERNELS_SPIN_US: microseconds a waiting thread spins before it sleeps. */
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

Kernels* kernels_new(int n_threads, int max_batch, int max_cols) {
    if (n_threads <= 0) n_threads = kernels_available_cpus();
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    Kernels* k = calloc(1, sizeof *k);
    if (!k) return NULL;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv_work, NULL);
    pthread_cond_init(&k->cv_done, NULL);
    k->n_threads = k->max_threads = 1;
    k->spin_ns = spin_us_from_env() * 1000L;
    atomic_init(&k->hold_ns, CONTENTION_HOLD_NS);
    atomic_init(&k->hold_idle, -1);
    for (int i = 0; i < MAX_THREADS; i++) k->looks[i].fd = -1;
    k->scratch = matmul_scratch_new(n_threads, max_batch, max_cols);
    if (!k->scratch) {
        kernels_free(k);
        return NULL;
    }
    pool_start(k, n_threads);
    k->max_threads = k->n_threads;
    return k;
}

int kernels_set_threads(Kernels* k, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > k->max_threads) n_threads = k->max_threads;
    if (n_threads != k->n_threads) {
        pool_stop(k);
        pool_start(k, n_threads);
    }
    return k->n_threads;
}

void kernels_free(Kernels* k) {
    if (!k) return;
    pool_stop(k);
    close_look(&k->looks[0]);
    matmul_scratch_free(k->scratch);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv_work);
    pthread_cond_destroy(&k->cv_done);
    free(k);
}

int kernels_threads(const Kernels* k) { return k->n_threads; }

/* The name says which arithmetic the kernels use where it changes results: "+vnni" (AVX-512) and
 * "+int8" (AVX2 alone), decode over a q8 cache on an int8 query; "+bf16", prefill over fp16 and q8
 * caches on bf16 pairs; "+amx", the tiles granted. */
const char* kernels_simd_name(const Kernels* k) {
#if defined(KERNELS_AVX512)
    static const char* const names[] = {"avx2+avx512",      "avx2+avx512+amx",      "avx2+avx512+bf16",
                                        "avx2+avx512+bf16+amx", "avx2+avx512+vnni", "avx2+avx512+vnni+amx",
                                        "avx2+avx512+vnni+bf16", "avx2+avx512+vnni+bf16+amx"};
    int i = kernels_amx(k) ? 1 : 0;
#if defined(KERNELS_BF16_DOT)
    i += 2;
#endif
#if defined(KERNELS_Q8_DOT)
    i += 4;
#endif
    return names[i];
#elif defined(KERNELS_AVX2) && defined(KERNELS_Q8_DOT)
    return "avx2+int8";
#elif defined(KERNELS_AVX2)
    return "avx2";
#elif defined(KERNELS_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
