/* pool.c: the kernel threads. A small pthread pool behind parallel_for: n_threads - 1 workers plus
 * the calling thread. Items are handed out through one atomic counter, so a thread that is slow
 * (descheduled, sharing its core with another process) simply takes fewer items.
 *
 * Waiting: a worker that finds no work spins for a short, bounded time (KERNELS_SPIN_US, default
 * below) with a pause instruction, then sleeps on a condition variable; the dispatching thread does
 * the same while it waits for the last worker. Decode issues a few hundred dispatches per token,
 * microseconds apart, so the spin saves a futex wake-up per dispatch; between tokens and when idle
 * every thread sleeps. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
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

static struct {
    int n_threads;
    int started;                /* workers running */
    pthread_t th[MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    void (*fn)(void*, int);
    void* ctx;
    int n;
    atomic_int next;            /* next item to hand out */
    atomic_int pending;         /* workers still inside the current dispatch */
    atomic_uint gen;            /* dispatch generation */
    atomic_int quit;
    atomic_int caller_waiting;
    int sleepers;               /* workers in cond_wait (under mu) */
    long spin_ns;
} P = {.n_threads = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv_work = PTHREAD_COND_INITIALIZER,
       .cv_done = PTHREAD_COND_INITIALIZER};

static _Thread_local int in_worker;  /* nested parallel_for runs serially */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void run_items(void) {
    void (*fn)(void*, int) = P.fn;
    void* ctx = P.ctx;
    int n = P.n;
    for (;;) {
        int i = atomic_fetch_add_explicit(&P.next, 1, memory_order_relaxed);
        if (i >= n) break;
        fn(ctx, i);
    }
}

static void* worker_main(void* arg) {
    (void)arg;
    in_worker = 1;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&P.gen, memory_order_acquire);
        if (g == seen && P.spin_ns > 0) {
            long t0 = now_ns();
            for (int k = 0; g == seen; k++) {
                CPU_RELAX();
                g = atomic_load_explicit(&P.gen, memory_order_acquire);
                if ((k & 63) == 63 && now_ns() - t0 > P.spin_ns) break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&P.mu);
            P.sleepers++;
            while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.quit))
                pthread_cond_wait(&P.cv_work, &P.mu);
            P.sleepers--;
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.quit)) break;
        seen = g;
        run_items();
        if (atomic_fetch_sub(&P.pending, 1) == 1 && atomic_load(&P.caller_waiting)) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.cv_done);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

void parallel_for(int n, void (*fn)(void* ctx, int i), void* ctx) {
    if (n <= 0) return;
    int workers = P.started;
    if (workers == 0 || n == 1 || in_worker) {
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    atomic_store(&P.next, 0);
    atomic_store(&P.pending, workers);
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
    if (P.sleepers > 0) pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);

    in_worker = 1;
    run_items();
    in_worker = 0;

    if (atomic_load(&P.pending) > 0) {
        long t0 = now_ns();
        for (int k = 0; atomic_load_explicit(&P.pending, memory_order_acquire) > 0; k++) {
            CPU_RELAX();
            if ((k & 63) == 63 && now_ns() - t0 > P.spin_ns) {
                pthread_mutex_lock(&P.mu);
                atomic_store(&P.caller_waiting, 1);
                while (atomic_load(&P.pending) > 0) pthread_cond_wait(&P.cv_done, &P.mu);
                atomic_store(&P.caller_waiting, 0);
                pthread_mutex_unlock(&P.mu);
                break;
            }
        }
    }
    atomic_thread_fence(memory_order_acquire);
}

static void pool_stop(void) {
    if (P.started == 0) return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.quit, 1);
    atomic_fetch_add(&P.gen, 1);
    pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.started; i++) pthread_join(P.th[i], NULL);
    P.started = 0;
    atomic_store(&P.quit, 0);
}

int kernels_init(int n_threads, int max_batch, int max_cols) {
    kernels_free();
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    const char* s = getenv("KERNELS_SPIN_US");
    P.spin_ns = (s ? atol(s) : DEFAULT_SPIN_US) * 1000L;
    if (P.spin_ns < 0) P.spin_ns = 0;
    if (matmul_scratch_init(max_batch, max_cols) != 0) return -1;
    P.n_threads = n_threads;
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&P.th[i], NULL, worker_main, NULL) != 0) break;
        P.started++;
    }
    P.n_threads = P.started + 1;
    return 0;
}

void kernels_free(void) {
    pool_stop();
    matmul_scratch_free();
    P.n_threads = 1;
}

int kernels_threads(void) { return P.n_threads; }

const char* kernels_simd_name(void) {
#if defined(KERNELS_AVX2)
    return "avx2";
#elif defined(KERNELS_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
