/* checkpoint.h: reading the checkpoint file (checkpoint.c) for the loader (model.c) and the tools
 * that walk its tensors (quantize, the bench). */
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

/* Faults the whole mapping in now, rather than page by page in the first forward pass, LOAD_PIECE
 * bytes at a time, with progress(ctx, bytes done, file size) between pieces where progress is not
 * NULL. */
#define LOAD_PIECE ((size_t)32 << 20)
void checkpoint_populate(const Transformer* t, void (*progress)(void* ctx, size_t done, size_t total), void* ctx);

/* Checks every field of t->header and the sections against the file, and fills t->config; seq_len
 * is ctx (<= 0: the default) held to the model's context. Returns 0 or -1 with the error written. */
int checkpoint_config(Transformer* t, int ctx, const LoadError* e);

/* Points every weight of t->weights into the mapping, walking TENSORS in file order; each
 * tensor must end inside the weights section. Returns 0 or -1 with the error written. */
int checkpoint_weights(Transformer* t, const LoadError* e);

/* Where tensor ti of layer l (and expert e) points in w: a Matrix or a const float*. Like strchr it
 * takes w as const, so that readers of the weights (quantize, the bench) need no cast; the loader,
 * which fills the slot, passes its own writable Weights. */
void* tensor_slot(const TensorInfo* ti, const Weights* w, int layer, int expert);

/* Calls fn(ctx, ti, layer, expert) for every tensor c's file stores, in file order (layer -1: a
 * global one; expert -1: not an expert's): the loader, quantize and the bench walk the table so. */
void for_each_tensor(const Config* c, void (*fn)(void* ctx, const TensorInfo* ti, int layer, int expert), void* ctx);

/* 2 MB-aligned anonymous memory marked for huge pages, its pages mapped only when first written
 * (the KV cache, the bench's buffer); free_huge_anonymous with the same size gives it back. */
void* alloc_huge_anonymous(size_t size);
void free_huge_anonymous(void* p, size_t size);

#endif
