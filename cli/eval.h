/* eval.h: `./run MODEL -m eval`, how well the model predicts a text: the text's tokens in
 * consecutive, non-overlapping windows of the context length (-c), every token of a window but its
 * first scored against the logits of the position before it. Prints the number of scored tokens,
 * the mean negative log-likelihood (the loss, nats per token), the perplexity exp(loss) and the
 * top-1 accuracy (the share of tokens that are the argmax of their logits). */
#ifndef EVAL_H
#define EVAL_H

#include "model.h"

/* Scores the n tokens ids (run.c reads them: --prompt-ids, or the text of -i, --file or standard
 * input). json: one line {"tokens": N, "loss": X, "ppl": Y, "top1": Z, "switches": S}, S the
 * RMSNorm lab's switches in force as a JSON object (cli/norm_lab.h, norm_lab_json; {} for none).
 * Returns 0, or 1 after one error line on stderr. */
int eval_main(Transformer* t, const int* ids, int n, int json, const char* switches);

#endif
