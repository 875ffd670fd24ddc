/* generation.c: what generate (run.c) and the chat loop share. */
#include "generation.h"
#include "output_path.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int is_eos(const FileHeader* h, int id) {
    for (uint32_t i = 0; i < h->n_eos; i++)
        if (h->eos_ids[i] == id) return 1;
    return 0;
}

const char* json_value(char* buf, size_t size, const char* fmt, double v) {
    if (!isfinite(v)) return "null";
    snprintf(buf, size, fmt, v);
    return buf;
}

int usable_cpus(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

int threads_held(int threads) {
    const int cpus = usable_cpus();
    if (cpus < 1 || threads <= cpus) return threads;
    fprintf(stderr, "run: note: --threads %d is more than the %d CPU%s this process may run on; using %d\n", threads,
            cpus, cpus == 1 ? "" : "s", cpus);
    return cpus;
}

int same_file(const char* a, const char* b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int logits_dump_open(LogitsDump* d, const char* path, const Transformer* t) {
    *d = (LogitsDump){.path = path};
    if (path == NULL) return 0;
    d->file = fopen(path, "wb");
    if (d->file == NULL) {
        fprintf(stderr, "run: error: %s: cannot open for writing: %s\n", path, strerror(errno));
        return -1;
    }
    output_path_written(d->file, path, d->written, sizeof d->written);
    d->rows = malloc((size_t)t->state.max_batch * (size_t)t->config.vocab_size * sizeof(float));
    if (d->rows == NULL) {
        fprintf(stderr, "run: error: out of memory\n");
        fclose(d->file);
        d->file = NULL;
        if (d->written[0]) remove(d->written);
        return -1;
    }
    return 0;
}

/* A write that failed: said, and the file closed and, where it is a regular file, removed; the dump
 * then writes nothing more. */
static void logits_dump_failed(LogitsDump* d, int err) {
    fprintf(stderr, "run: error: %s: write failed: %s\n", d->path, strerror(err));
    if (d->file) fclose(d->file);
    d->file = NULL;
    if (d->written[0]) remove(d->written);
}

int logits_dump_close(LogitsDump* d) {
    int failed = 0;
    if (d->file) {
        failed = fflush(d->file) != 0;
        int err = errno;
        if (fclose(d->file) != 0 && !failed) failed = 1, err = errno;
        d->file = NULL;
        if (failed) logits_dump_failed(d, err);
    }
    free(d->rows);
    *d = (LogitsDump){0};
    return failed ? -1 : 0;
}

float* forward_dumped(Transformer* t, const int* ids, int n, int pos, LogitsDump* d) {
    return forward_prompt(t, ids, n, pos, d, NULL, NULL, NULL);
}

/* The small pieces cost one more row through the head per piece where only the last row's logits
 * are wanted (docs/design.md#seam has the measurement). */
int watched_piece(const Transformer* t) { return t->ops->split_exact ? EXACT_SPLIT_PIECE : t->state.max_batch; }

float* forward_prompt(Transformer* t, const int* ids, int n, int pos, LogitsDump* d, int (*between)(void*, int, int),
                      void* ctx, int* stopped) {
    const size_t V = (size_t)t->config.vocab_size;
    const int max_batch = between ? watched_piece(t) : t->state.max_batch;
    static LogitsDump none; /* d NULL: no dump */
    if (d == NULL) d = &none;
    float* logits = NULL;
    for (int i = 0; i < n;) {
        if (i > 0 && between && between(ctx, i, n)) {
            *stopped = 1;
            return NULL;
        }
        const int nb = (d->file || between) && n - i > max_batch ? max_batch : n - i;
        logits = forward(t, ids + i, nb, pos + i, d->file ? d->rows : NULL);
        if (logits == NULL) {
            fprintf(stderr, "run: error: forward pass failed\n");
            return NULL;
        }
        if (d->file && fwrite(d->rows, sizeof(float), (size_t)nb * V, d->file) != (size_t)nb * V) {
            logits_dump_failed(d, errno);
            return NULL;
        }
        i += nb;
    }
    return logits;
}

/* The prompt's time left, for a token at position q costing a + b q seconds (attention's share
 * grows with q): a and b fitted to the time since the first call and to the last chunk's; b = 0
 * (a constant rate) where the two do not give a positive b. */
static double time_left(const PromptProgress* p, int done, int n, double now) {
    const double d0 = p->start_done, dl = p->last_done, d = done, T = now - p->start, dt = now - p->last;
    const double x1 = d - d0, y1 = (d * d - d0 * d0) / 2, x2 = d - dl, y2 = (d * d - dl * dl) / 2;
    const double det = x1 * y2 - x2 * y1;
    double a = T / x1, b = 0;
    if (det != 0 && dt > 0) {
        const double fa = (T * y2 - dt * y1) / det, fb = (x1 * dt - x2 * T) / det;
        if (fb > 0 && fa > 0) a = fa, b = fb;
    }
    return a * (n - d) + b * ((double)n * n - d * d) / 2;
}

volatile sig_atomic_t ctrl_c_pressed;

static void on_ctrl_c(int sig) {
    (void)sig;
    ctrl_c_pressed = 1;
}

void catch_ctrl_c(struct sigaction* old) {
    struct sigaction on = {.sa_handler = on_ctrl_c};
    sigemptyset(&on.sa_mask);
    sigaction(SIGINT, NULL, old);
    if (old->sa_handler != SIG_IGN) sigaction(SIGINT, &on, NULL);
}

void release_ctrl_c(const struct sigaction* old) { sigaction(SIGINT, old, NULL); }

int prompt_progress(void* ctx, int done, int n) {
    PromptProgress* p = ctx;
    if (p->show) {
        const double now = now_seconds();
        if (p->start_done == 0) p->start = p->last = now, p->start_done = p->last_done = done;
        fprintf(stderr, "\r%s: prompt %d/%d tokens", p->label, done, n);
        if (done > p->last_done && now > p->last) {
            const double left = time_left(p, done, n, now);
            fprintf(stderr, ", %.0f tok/s, %d:%02d left", (done - p->last_done) / (now - p->last), (int)left / 60,
                    (int)left % 60);
            p->last = now, p->last_done = done;
        }
        fputs("\033[K", stderr); /* the end of a longer line before */
        fflush(stderr);
        p->shown = 1;
    }
    return p->stop && *p->stop;
}

void prompt_progress_end(PromptProgress* p) {
    if (p->shown) fputs("\r\033[K", stderr);
    p->shown = 0;
}

void load_progress(void* ctx, size_t done, size_t total) {
    LoadProgress* p = ctx;
    const double now = now_seconds();
    if (!p->show || (p->shown && now - p->last < 0.1)) return; /* a file the cache holds goes by in a blink */
    const char* slash = strrchr(p->path, '/');
    const char* name = slash ? slash + 1 : p->path; /* one line, however long the path */
    const double s = now - p->start;
    p->last = now;
    fprintf(stderr, "\r%s: reading %s: %.0f%% of %.1f GB", p->label, name, 100.0 * (double)done / (double)total,
            (double)total / 1e9);
    if (s > 0) fprintf(stderr, ", %.1f GB/s", (double)done / 1e9 / s);
    fputs("\033[K", stderr);
    fflush(stderr);
    p->shown = 1;
}

void load_progress_end(LoadProgress* p) {
    if (p->shown) fputs("\r\033[K", stderr);
    p->shown = 0;
}

void print_speed(int n_prompt, double prefill_s, int n_generated, int n_decoded, double decode_s, double first_token_s) {
    fprintf(stderr, "prompt tokens: %d, prefill: %.1f tok/s, generated tokens: %d, decode: ", n_prompt,
            n_prompt / (prefill_s > 0 ? prefill_s : 1e-9), n_generated);
    if (n_decoded > 0) fprintf(stderr, "%.1f tok/s", n_decoded / (decode_s > 0 ? decode_s : 1e-9));
    else fputs("- tok/s", stderr);
    if (first_token_s > 0) fprintf(stderr, ", first token after %.3f s", first_token_s);
    fputc('\n', stderr);
}

const char* context_advice(const Config* c, char* buf, size_t size) {
    snprintf(buf, size, c->seq_len < c->max_seq_len ? "a larger -c/--ctx allows more (the model supports %d)"
                                                    : "%d is the model's maximum", c->max_seq_len);
    return buf;
}

void print_token_ids(const int* ids, int n, const char* label, ...) {
    va_list ap;
    va_start(ap, label);
    vfprintf(stderr, label, ap);
    va_end(ap);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : " ", ids[i]);
    fputc('\n', stderr);
}
