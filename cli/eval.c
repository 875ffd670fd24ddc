/* eval.c: `-m eval` (eval.h): loss, perplexity and top-1 accuracy of the model on a text. */
#include "eval.h"
#include "generation.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The sums of a scored stretch: what eval prints is computed from them. */
typedef struct {
    long long tokens; /* scored tokens */
    long long top1;   /* of which the argmax of the logits */
    long long broken; /* of which the score is not a number: NaN or infinite logits */
    double nll;       /* sum of -log p(token), natural log */
} EvalSums;

/* Adds n_rows rows of logits, row i scored against targets[i]: -log softmax(row)[target] in double
 * (max-subtracted log-sum-exp), and whether target is the row's (first) argmax, NaN skipped (a row
 * of NaN has none). */
static void score_rows(EvalSums* sums, const float* rows, int n_rows, int vocab_size, const int* targets) {
    for (int r = 0; r < n_rows; r++) {
        const float* row = rows + (size_t)r * (size_t)vocab_size;
        int best = -1;
        for (int j = 0; j < vocab_size; j++)
            if (!isnan(row[j]) && (best < 0 || row[j] > row[best])) best = j;
        const double m = best < 0 ? NAN : row[best];
        double sum = 0.0;
        for (int j = 0; j < vocab_size; j++) sum += exp((double)row[j] - m);
        const double nll = m + log(sum) - (double)row[targets[r]];
        sums->nll += nll;
        sums->broken += !isfinite(nll);
        sums->top1 += best == targets[r];
        sums->tokens++;
    }
}

/* Progress on stderr: in place at a terminal, otherwise one line a second once a second has
 * passed (a short run prints nothing there). */
typedef struct {
    int tty;
    double start, last;
    int shown;
} Progress;

static void progress(Progress* p, int done, int total, const EvalSums* s) {
    const double now = now_seconds();
    if (now - p->last < (p->tty ? 0.1 : 1.0) || (!p->tty && now - p->start < 1.0)) return;
    p->last = now;
    p->shown = 1;
    fprintf(stderr, "%seval: %d of %d predictions scored, loss so far %.4f%s", p->tty ? "\r" : "", done, total,
            s->tokens ? s->nll / (double)s->tokens : 0.0, p->tty ? "" : "\n");
}


static void report(const EvalSums* s, int window, int json, const char* switches) {
    const double loss = s->nll / (double)s->tokens, ppl = exp(loss), top1 = (double)s->top1 / (double)s->tokens;
    if (s->broken)
        fprintf(stderr, "run: note: at %lld of the %lld scored positions the logits are NaN or infinite (weights that "
                "hold NaN or infinity, or activations that overflowed: the RMSNorm lab's switches can do that), so the "
                "loss and perplexity are not numbers%s\n", s->broken, s->tokens, json ? " (null)" : "");
    if (json) {
        printf("{\"tokens\": %lld, \"loss\": ", s->tokens);
        char v[32];
        fputs(json_value(v, sizeof v, "%.6f", loss), stdout);
        printf(", \"ppl\": ");
        fputs(json_value(v, sizeof v, "%.6g", ppl), stdout);
        printf(", \"top1\": %.6f, \"switches\": %s}\n", top1, switches);
        return;
    }
    printf("scored tokens  %lld (windows of %d tokens, each scored but its first)\n", s->tokens, window);
    printf("loss           %.6f nats/token\n", loss);
    printf("perplexity     %.6g\n", ppl);
    printf("top-1          %.6f\n", top1);
}

/* Scores ids[0 .. n-1] in windows of the context length; 0, 1 after an error line, or 130 after
 * Ctrl-C, which stops it after the chunk it is in (with the report of what was scored). */
static int score_text(Transformer* t, const int* ids, int n, float* rows, int json, const char* switches) {
    const int V = t->config.vocab_size, window = t->config.seq_len, B = watched_piece(t);
    EvalSums sums = {0, 0, 0, 0.0};
    Progress prog = {isatty(fileno(stderr)), now_seconds(), 0.0, 0};
    /* Window w holds ids [w0, w0 + len); its positions 0 .. len-2 predict the tokens 1 .. len-1,
     * so its last token goes in only as a target. Prefill in chunks of watched_piece rows (every
     * row's logits are scored, so a small piece costs nothing more). */
    int total = 0; /* predictions scored in all: a token per window fewer than the text has */
    for (int w0 = 0; w0 < n - 1; w0 += window) total += (n - w0 < window ? n - w0 : window) - 1;
    for (int w0 = 0; w0 < n - 1 && !ctrl_c_pressed; w0 += window) {
        const int len = n - w0 < window ? n - w0 : window;
        for (int i = 0; i < len - 1 && !ctrl_c_pressed; i += B) {
            const int nb = len - 1 - i < B ? len - 1 - i : B;
            if (forward(t, ids + w0 + i, nb, i, rows) == NULL) {
                fprintf(stderr, "%srun: error: forward pass failed\n", prog.shown && prog.tty ? "\n" : "");
                return 1;
            }
            score_rows(&sums, rows, nb, V, ids + w0 + i + 1);
            progress(&prog, (int)sums.tokens, total, &sums);
        }
    }
    if (prog.shown && prog.tty) fprintf(stderr, "\r\033[K"); /* the terminal as it was */
    if (ctrl_c_pressed && sums.tokens == 0) {
        fprintf(stderr, "run: interrupted before a token was scored\n");
        return 130;
    }
    if (ctrl_c_pressed)
        fprintf(stderr, "run: interrupted: the scores of the first %lld of %d predictions\n", sums.tokens, total);
    report(&sums, window, json, switches);
    return ctrl_c_pressed ? 130 : 0;
}

int eval_main(Transformer* t, const int* ids, int n, int json, const char* switches) {
    float* rows = malloc((size_t)t->state.max_batch * (size_t)t->config.vocab_size * sizeof(float));
    int status = 1;
    if (t->config.seq_len < 2) { /* a bad command line */
        fprintf(stderr, "run: error: -m eval needs a context (-c) of at least 2 tokens\n");
        status = 2;
    } else if (n < 2)
        fprintf(stderr, "run: error: nothing to score: the text is %d token%s, eval needs at least 2\n", n,
                n == 1 ? "" : "s");
    else if (rows == NULL)
        fprintf(stderr, "run: error: out of memory\n");
    else {
        struct sigaction old_int;
        catch_ctrl_c(&old_int);
        status = score_text(t, ids, n, rows, json, switches);
        release_ctrl_c(&old_int);
    }
    free(rows);
    return status;
}
