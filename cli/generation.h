/* generation.h: what generate (run.c), the chat loop (chat.c) and eval (eval.c) share; errors are one line on stderr. */
#ifndef GENERATION_H
#define GENERATION_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "model.h"

/* 1 when paths a and b name one existing file (a link to it included): an output that would
 * write over the checkpoint, which the model reads through its mapping as it runs. */
int same_file(const char* a, const char* b);

/* The CPUs this process may run on (its affinity mask, e.g. under taskset), 0 where it cannot tell. */
int usable_cpus(void);
/* --threads N held to usable_cpus(), with a note where N is above them: more threads than CPUs
 * only take turns on them (generate, chat, eval and quantize). */
int threads_held(int threads);

/* v in fmt into buf[size] as a JSON number, or "null" where it is NaN or infinite (JSON has neither):
 * eval's --json and the --norms-json trace. */
const char* json_value(char* buf, size_t size, const char* fmt, double v);

/* Why every logit of a position can be NaN (the sampler then has no token), for the error line of
 * generate and chat. */
#define NAN_LOGITS_WHY "weights that hold NaN or infinity, or activations that overflowed or divided by zero"

/* --dump-logits: the file and room for one prefill chunk's rows. */
typedef struct {
    FILE* file; /* NULL: no dump */
    float* rows;
    const char* path;
    char written[4096]; /* the regular file a failed write removes ("": a device such as /dev/full) */
} LogitsDump;

/* 0 (path NULL: no dump), or -1 after an error line. */
int logits_dump_open(LogitsDump* d, const char* path, const Transformer* t);
/* 0, or -1 after an error line when the file could not be written whole; a regular file is then
 * removed rather than left with part of the logits. */
int logits_dump_close(LogitsDump* d);

/* forward() of n tokens from position pos; with a dump, in chunks of max_batch rows whose logits all
 * go to the file. The last position's logits, or NULL after an error line. */
float* forward_dumped(Transformer* t, const int* ids, int n, int pos, LogitsDump* d);

/* Positions per forward() call where the command line looks for a Ctrl-C and shows progress between
 * calls: forward()'s own chunks of max_batch (the same bits as one call), or EXACT_SPLIT_PIECE where
 * the ops give the same bits however the rows are split (Ops.split_exact, the reference build), so
 * that at its speed the looks come every 10 to 20 s on Qwen3-0.6B instead of every four minutes. */
#define EXACT_SPLIT_PIECE 16
int watched_piece(const Transformer* t);

/* forward_dumped a chunk at a time (d NULL: no dump): watched_piece positions, with between(ctx,
 * done, n) before each chunk after the first, which may show progress and returns nonzero to stop
 * there (*stopped = 1, NULL returned); without between, max_batch. */
float* forward_prompt(Transformer* t, const int* ids, int n, int pos, LogitsDump* d, int (*between)(void*, int, int),
                      void* ctx, int* stopped);

/* forward_prompt's between: where show, "\r<label>: prompt <done>/<n> tokens, <rate> tok/s, <time>
 * left" on stderr, one line written over (prompt_progress_end clears it); stops where *stop is set
 * (stop NULL: never). The rate is the last chunk's; the time left follows the rate's fall with the
 * depth. start, last: the times of the first and the latest call (0 before the first). */
typedef struct {
    const char* label;
    int show, shown;
    volatile sig_atomic_t* stop;
    double start, last;
    int start_done, last_done;
} PromptProgress;
int prompt_progress(void* ctx, int done, int n);
void prompt_progress_end(PromptProgress* p);

/* transformer_load's load_progress: where show, "\r<label>: reading <the file's name>: <pct>% of
 * <size> GB, <rate> GB/s" on stderr, one line written over at most every 0.1 s (load_progress_end
 * clears it). start: when the load began; last: the latest line's time. */
typedef struct {
    const char* label;
    const char* path;
    int show, shown;
    double start, last;
} LoadProgress;
void load_progress(void* ctx, size_t done, size_t total);
void load_progress_end(LoadProgress* p);

/* Ctrl-C as a flag, for generate and eval: between catch_ctrl_c and release_ctrl_c a SIGINT only
 * sets ctrl_c_pressed, which the loops test between chunks and tokens. A Ctrl-C ignored when the run
 * started (nohup, a background job) stays ignored. (Chat has its own handling: chat.c.) */
extern volatile sig_atomic_t ctrl_c_pressed;
void catch_ctrl_c(struct sigaction* old);
void release_ctrl_c(const struct sigaction* old);

int is_eos(const FileHeader* h, int id);
double now_seconds(void);

/* The line that ends a run: prompt tokens, prefill tok/s, generated tokens, decode tok/s, and where
 * first_token_s > 0 the time from the start of the prompt to the first token printed. */
void print_speed(int n_prompt, double prefill_s, int n_generated, int n_decoded, double decode_s, double first_token_s);

/* What a full context leaves the user to do, into buf: "a larger -c/--ctx allows more (the model
 * supports N)", or that the context is already the model's maximum. Returns buf. */
const char* context_advice(const Config* c, char* buf, size_t size);

/* --verbose-prompt's line on stderr: the label (a printf format), then the ids as " 1,2,3". */
void print_token_ids(const int* ids, int n, const char* label, ...) __attribute__((format(printf, 3, 4)));

#endif
