/* checkpoint.h: reading the checkpoint file (checkpoint.c) for the loader (model.c). */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <stdint.h>

#include "model.h"

/* Where a load reports its one error line, "PATH: problem". */
typedef struct {
    const char* path;
    char* buf;
    size_t len;
} LoadError;

/* Writes "PATH: message" into e's buffer and returns -1. */
int load_fail(const LoadError* e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* Maps the file at e->path, a regular file at least a header long, into t->file. Returns 0, or -1
 * with the error written and nothing mapped. */
int checkpoint_map(Transformer* t, const LoadError* e);

/* Checks every field of t->header and the sections against the file, and fills t->config; seq_len
 * is ctx (<= 0: the default) held to the model's context. Returns 0 or -1 with the error written. */
int checkpoint_config(Transformer* t, int ctx, const LoadError* e);

/* Walks the tensors (TENSORS): each tensor starts at the next multiple of CHECKPOINT_ALIGN
 * and must end inside the weights section. Offsets are uint64_t and start inside the file
 * (check_sections), and a tensor has fewer than 2^31 values, so no sum here can wrap around. */
typedef struct {
    const uint8_t* base;  /* the mapped file */
    uint64_t pos, end;    /* file offsets: the end of the previous tensor, the end of the weights section */
    const Config* c;
    Weights* w;           /* where the pointers go */
    int layer;            /* the layer being walked, for the error; -1: outside the layers */
    const LoadError* e;
    int failed;
} TensorWalk;

/* The next tensor of the walk, `bytes` long (what: its name, for the error); NULL once one does
 * not fit, with w->failed set and the error written. */
const void* checkpoint_take(TensorWalk* w, uint64_t bytes, const char* what);

#endif
