/* tests/test_forward_prompt.c: forward_prompt (cli/generation.c), the prompt as the command line
 * runs it, in chunks with a look at Ctrl-C and the progress between them. The chunks are
 * forward()'s own (max_batch positions), except where the ops give the same bits however the rows
 * are split (Ops.split_exact: the reference ops), where they are EXACT_SPLIT_PIECE positions, so
 * that the reference build's Ctrl-C does not wait minutes. Checked on the shipped model over an
 * fp32 and a q8 cache, with the reference ops put in front of the build's own (so the fast build
 * checks the pieces too): the looks between the pieces, the last position's logits bit for bit
 * against one forward() call of the whole prompt, and a stop at the first look. The build's own
 * ops are split-exact only where they are the reference ops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "cli/generation.h"

#include "tests/check.h"

#define MODEL_PATH "models/tinystories.bin"
#define N 40

typedef struct {
    int done[N], n_calls, stop_at; /* stop_at: the call (from 1) that asks to stop; 0: none */
} Looks;

static int look(void* ctx, int done, int n) {
    Looks* l = ctx;
    (void)n;
    if (l->n_calls < N) l->done[l->n_calls] = done;
    return ++l->n_calls == l->stop_at;
}

/* The prompt through ops (t->ops for the call), against one forward() call with the same ops. */
static void check_pieces(Transformer* t, const Ops* ops, const int* ids, const char* name) {
    char what[200];
    const Ops* own = t->ops;
    t->ops = ops;
    const size_t V = (size_t)t->config.vocab_size;
    float* whole = malloc(V * sizeof(float));
    const float* l = forward(t, ids, N, 0, NULL);
    check(l != NULL && whole != NULL, "forward() of the whole prompt");
    if (l == NULL || whole == NULL) goto done;
    memcpy(whole, l, V * sizeof(float));

    const int piece = ops->split_exact ? EXACT_SPLIT_PIECE : t->state.max_batch;
    Looks looks = {0};
    int stopped = 0;
    l = forward_prompt(t, ids, N, 0, NULL, look, &looks, &stopped);
    int expected = 1;
    for (int k = 0; k < looks.n_calls; k++) expected = expected && looks.done[k] == (k + 1) * piece;
    snprintf(what, sizeof what, "%s: a look after every %d positions (%d looks)", name, piece, looks.n_calls);
    check(expected && looks.n_calls == (N - 1) / piece, what);
    snprintf(what, sizeof what, "%s: the last position's logits are one forward() call's, bit for bit", name);
    check(l != NULL && !stopped && memcmp(l, whole, V * sizeof(float)) == 0, what);

    if (looks.n_calls > 0) {
        Looks first = {.stop_at = 1};
        stopped = 0;
        l = forward_prompt(t, ids, N, 0, NULL, look, &first, &stopped);
        snprintf(what, sizeof what, "%s: a stop at the first look returns NULL after %d positions", name, piece);
        check(l == NULL && stopped && first.n_calls == 1 && first.done[0] == piece, what);
    }
done:
    free(whole);
    t->ops = own;
}

int main(void) {
    if (!readable_or_skipped(MODEL_PATH)) return 0;
    const KVType kv_types[] = {KV_F32, KV_Q8};
    for (int k = 0; k < 2; k++) {
        Transformer t;
        char err[512], name[64];
        const TransformerOptions opt = {.threads = 2, .kv_type = kv_types[k]};
        if (transformer_load(&t, MODEL_PATH, &opt, err, sizeof err) != 0) {
            printf("FAIL: %s\n", err);
            return 1;
        }
        int ids[N];
        for (int i = 0; i < N; i++) ids[i] = 1 + (i * 37) % (t.config.vocab_size - 1);
        if (k == 0)
            check(t.kernels->split_exact == (strcmp(t.kernels->name, "reference") == 0),
                  "the build's ops are split-exact where they are the reference ops");
        Ops* ref = ops_reference_new(&(OpsSpec){.max_pos = t.config.seq_len});
        check(ref != NULL && ref->split_exact, "the reference ops are split-exact");
        snprintf(name, sizeof name, "reference ops, %s cache", k == 0 ? "fp32" : "q8");
        if (ref) check_pieces(&t, ref, ids, name);
        ops_free(ref);
        transformer_free(&t);
    }
    return checks_done();
}
