/* eval.h: `./run MODEL -m eval`, how well the model predicts a text: the text's tokens in
 * consecutive, non-overlapping windows of the context length (-c), every token of a window but its
 * first scored against the logits of the position before it. Prints the number of scored tokens,
 * the mean negative log-likelihood (the loss, nats per token), the perplexity exp(loss) and the
 * top-1 accuracy (the share of tokens that are the argmax of their logits). */
#ifndef EVAL_H
#define EVAL_H

#include "model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char* text;  /* -i: the text; NULL: file, else standard input */
    const char* file;  /* --file */
    const int* ids;    /* --prompt-ids: the tokens themselves (then text and file are NULL) */
    int n_ids;
    int json;          /* --json: one line {"tokens": N, "loss": X, "ppl": Y, "top1": Z} */
} EvalOptions;

/* tok may be NULL (a checkpoint without tokenizer) when o->ids is given. Returns 0, or 1 after one
 * error line on stderr. */
int eval_main(Transformer* t, const Tokenizer* tok, const EvalOptions* o);

#endif
