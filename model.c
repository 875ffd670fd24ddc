/* model.c: Qwen3's weights, its run state, and the forward pass.
 *
 * The file layout is documented in model.h (THE CHECKPOINT FILE); checkpoint.c maps and checks
 * the file and points every weight into it, walking the table TENSORS that this file lists.
 * forward() is one function in the style of llama2.c: every weight is a named pointer, every step
 * cites the spec, and every operation that costs time is an op of kernels/ops.h (the reference
 * kernels or the fast ones; nothing here knows which); docs/design.md has the measurements behind
 * its choices. The spec is QWEN3.md (../shared/QWEN3.md; docs/spec-sections.md sums up each
 * section): "2.2 step 2.4" is its section 2.2, step 4 of the per-layer step 2; "(7.3)" item 3 of
 * section 7, the easy mistakes. */
#include "model.h"
#include "checkpoint.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* How many positions one batch (one matmul) holds; longer prompts go through in chunks. Each chunk
 * reads every weight once: with 256 rows the matmuls are compute-bound, and the activation buffers
 * stay modest (16 MB for Qwen3-0.6B). A mixture of experts spreads a chunk's rows over its
 * experts, so its chunks are twice as long (docs/design.md#prefill-chunks). */
#define MAX_BATCH(c) ((c)->flags & FLAG_MOE ? 512 : 256)
/* mixture_of_experts' experts per call to the ops: above any Qwen3-MoE's k (8), so a decoded token's
 * experts are one call, and a chunk's scratch holds at most min(k, 16) copies of each row. */
#define EXPERTS_AT_ONCE 16

/* Every tensor of the file in its order (model.h, TensorInfo). */
const TensorInfo TENSORS[] = {
    /* BEGIN TENSOR TABLE: name, place, rows, cols (SIZE_NONE: a float32 vector), only with, not with, float32 */
    {"embed_tokens",             GLOBAL, SIZE_VOCAB,  SIZE_DIM,    0, 0, 0, offsetof(Weights, embed_tokens)},
    {"input_layernorm",          LAYER,  SIZE_DIM,    SIZE_NONE,   0, 0, 0, offsetof(LayerWeights, input_layernorm)},
    {"q_proj",                   LAYER,  SIZE_Q,      SIZE_DIM,    0, 0, 0, offsetof(LayerWeights, q_proj)},
    {"q_bias",                   LAYER,  SIZE_Q,      SIZE_NONE,   FLAG_QKV_BIAS, 0, 0, offsetof(LayerWeights, q_bias)},
    {"k_proj",                   LAYER,  SIZE_KV,     SIZE_DIM,    0, 0, 0, offsetof(LayerWeights, k_proj)},
    {"k_bias",                   LAYER,  SIZE_KV,     SIZE_NONE,   FLAG_QKV_BIAS, 0, 0, offsetof(LayerWeights, k_bias)},
    {"v_proj",                   LAYER,  SIZE_KV,     SIZE_DIM,    0, 0, 0, offsetof(LayerWeights, v_proj)},
    {"v_bias",                   LAYER,  SIZE_KV,     SIZE_NONE,   FLAG_QKV_BIAS, 0, 0, offsetof(LayerWeights, v_bias)},
    {"q_norm",                   LAYER,  SIZE_HEAD,   SIZE_NONE,   FLAG_QK_NORM, 0, 0, offsetof(LayerWeights, q_norm)},
    {"k_norm",                   LAYER,  SIZE_HEAD,   SIZE_NONE,   FLAG_QK_NORM, 0, 0, offsetof(LayerWeights, k_norm)},
    {"o_proj",                   LAYER,  SIZE_DIM,    SIZE_Q,      0, 0, 0, offsetof(LayerWeights, o_proj)},
    {"post_attention_layernorm", LAYER,  SIZE_DIM,    SIZE_NONE,   0, 0, 0, offsetof(LayerWeights, post_attention_layernorm)},
    {"gate_proj",                LAYER,  SIZE_HIDDEN, SIZE_DIM,    0, FLAG_MOE_LAYER, 0, offsetof(LayerWeights, gate_proj)},
    {"up_proj",                  LAYER,  SIZE_HIDDEN, SIZE_DIM,    0, FLAG_MOE_LAYER, 0, offsetof(LayerWeights, up_proj)},
    {"down_proj",                LAYER,  SIZE_DIM,    SIZE_HIDDEN, 0, FLAG_MOE_LAYER, 0, offsetof(LayerWeights, down_proj)},
    {"router",                   LAYER,  SIZE_EXPERTS, SIZE_DIM,   FLAG_MOE_LAYER, 0, 1, offsetof(LayerWeights, router)},
    {"expert_gate",              EXPERT, SIZE_EXPERT_HIDDEN, SIZE_DIM, FLAG_MOE_LAYER, 0, 0, offsetof(LayerWeights, expert_gate)},
    {"expert_up",                EXPERT, SIZE_EXPERT_HIDDEN, SIZE_DIM, FLAG_MOE_LAYER, 0, 0, offsetof(LayerWeights, expert_up)},
    {"expert_down",              EXPERT, SIZE_DIM, SIZE_EXPERT_HIDDEN, FLAG_MOE_LAYER, 0, 0, offsetof(LayerWeights, expert_down)},
    {"norm",                     GLOBAL, SIZE_DIM,    SIZE_NONE,   0, 0, 0, offsetof(Weights, norm)},
    {"lm_head",                  GLOBAL, SIZE_VOCAB,  SIZE_DIM,    0, FLAG_TIED_EMBED, 0, offsetof(Weights, lm_head)},
    /* END TENSOR TABLE */
};
const int N_TENSORS = sizeof TENSORS / sizeof TENSORS[0];

int tensor_size(TensorSize s, const Config* c) {
    switch (s) {
    case SIZE_DIM: return c->dim;
    case SIZE_HIDDEN: return c->hidden_dim;
    case SIZE_VOCAB: return c->vocab_size;
    case SIZE_Q: return c->n_heads * c->head_dim;
    case SIZE_KV: return c->n_kv_heads * c->head_dim;
    case SIZE_HEAD: return c->head_dim;
    case SIZE_EXPERTS: return c->n_experts;
    case SIZE_EXPERT_HIDDEN: return c->moe_hidden_dim;
    default: return 1;
    }
}

/* transformers' Qwen3MoeDecoderLayer: experts unless the layer is in mlp_only_layers, or (l + 1) is
 * not a multiple of decoder_sparse_step. */
int config_layer_is_moe(const Config* c, int l) {
    if (!(c->flags & FLAG_MOE) || (l + 1) % c->moe_sparse_step != 0) return 0;
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only[i] == l) return 0;
    return 1;
}

/* YaRN's frequency of dimension pair i (QWEN3.md 2.9, transformers' _compute_yarn_parameters):
 * the plain frequency where a pair turns more than beta_fast times over the original context, the
 * frequency divided by the factor where it turns fewer than beta_slow times, a linear ramp between.
 * The ramp's ends are the dimensions that turn r times, d ln(L / (2 pi r)) / (2 ln theta), in
 * double as transformers computes them in Python; the rest in float32, as its tensors are. */
static float yarn_inv_freq(const Config* c, int i, float pos_freq) {
    const int d = c->head_dim;
    const double L = c->rope_original_max, ln_theta = log(c->rope_theta), two_pi = 6.283185307179586;
    double low = d * log(L / (c->rope_beta_fast * two_pi)) / (2 * ln_theta);
    double high = d * log(L / (c->rope_beta_slow * two_pi)) / (2 * ln_theta);
    if (c->rope_truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;
    if (high > d - 1) high = d - 1;
    if (low == high) high += 0.001; /* no division by zero */
    float ramp = ((float)i - (float)low) / (float)(high - low);
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    const float extrapolate = 1.0f - ramp; /* the share of the plain frequency */
    const float plain = 1.0f / pos_freq, interpolated = 1.0f / (c->rope_factor * pos_freq);
    return interpolated * (1.0f - extrapolate) + plain * extrapolate;
}

/* RoPE tables (QWEN3.md 2.4): inv_freq[i] = 1 / theta^(2i/d) in float32 with powf, and
 * angle = p * inv_freq[i] as a float32 product, exactly as HF computes them in float32. With YaRN
 * (2.9) the frequencies are blended and cos and sin both multiplied by the attention factor, so
 * every attention score is scaled by its square. */
static void rope_tables(const Config* c, float* cos_t, float* sin_t) {
    const int half = c->head_dim / 2, yarn = c->flags & FLAG_ROPE_YARN;
    const float gain = yarn ? c->rope_attention_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        const float pos_freq = powf((float)c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        const float inv_freq = yarn ? yarn_inv_freq(c, i, pos_freq) : 1.0f / pos_freq;
        for (int p = 0; p < c->seq_len; p++) {
            const float angle = (float)p * inv_freq;
            cos_t[(size_t)p * half + i] = yarn ? cosf(angle) * gain : cosf(angle);
            sin_t[(size_t)p * half + i] = yarn ? sinf(angle) * gain : sinf(angle);
        }
    }
}

/* The KV cache (keys and values alike) in blocks of kv_block_len positions,
 * [block][layer][kv head][position in block][d]: the cache grows in position order, so its 2 MB
 * pages map little more than the positions reached, and a kv head's rows in a block are one run
 * that attention reads as a stream (64 to 128 KB for Qwen3's head_dim; docs/design.md#kv-cache). */
static size_t kv_block_elems(const Config* c, const RunState* s) {
    return (size_t)c->n_layers * c->n_kv_heads * (size_t)kv_block_len(s->kv_type) * s->kv_row;
}

/* Where layer l, kv head h, position p sits in either cache, in elements (kernels.h, KVType). */
static size_t kv_offset(const Config* c, const RunState* s, int l, int h, int p) {
    const size_t bl = (size_t)kv_block_len(s->kv_type), row = ((size_t)l * c->n_kv_heads + (size_t)h) * bl + p % bl;
    return p / bl * kv_block_elems(c, s) + row * s->kv_row;
}

/* Stores the n values of one kv head at element `at` of a cache: as they are, as halves or as q8. */
static void kv_store(const RunState* s, void* cache, size_t at, const float* x, int n) {
    if (s->kv_type == KV_F16)
        float_to_half_row((uint16_t*)cache + at, x, n);
    else if (s->kv_type == KV_Q8)
        kv_quantize_row((int8_t*)cache + at, x, n);
    else
        memcpy((float*)cache + at, x, (size_t)n * sizeof(float));
}

/* The activations and the KV cache. Returns 0 or -1 with the error written. */
static int alloc_state(Transformer* t, KVType kv_type, const LoadError* e) {
    const Config* c = &t->config;
    RunState* s = &t->state;
    const size_t B = MAX_BATCH(c), D = (size_t)c->dim, half = (size_t)c->head_dim / 2;
    const size_t E = (size_t)c->n_experts, k = (size_t)c->n_experts_active, moe = (c->flags & FLAG_MOE) != 0;
    const size_t G = moe * (k < EXPERTS_AT_ONCE ? k : EXPERTS_AT_ONCE); /* a row's copies in one call of experts */
    const size_t F = (size_t)c->hidden_dim > G * c->moe_hidden_dim ? (size_t)c->hidden_dim : G * c->moe_hidden_dim;
    const size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    const struct { float** buf; size_t floats; } buffers[] = {
        {&s->x, B * D}, {&s->xb, B * D}, {&s->proj, B * D}, {&s->q, B * q_dim}, {&s->att_out, B * q_dim},
        {&s->k, B * kv_dim}, {&s->v, B * kv_dim}, {&s->gate, B * F}, {&s->up, B * F}, {&s->logits, (size_t)c->vocab_size},
        {&s->rope_cos, (size_t)c->seq_len * half}, {&s->rope_sin, (size_t)c->seq_len * half},
        {&s->router_logits, moe * B * E}, {&s->expert_weight, moe * B * k}, {&s->expert_in, G * B * D},
        {&s->expert_out, G * B * D},
    };
    s->max_batch = (int)B;
    /* The caches: whole blocks of positions, memory used only as positions reach them (populate_kv_cache). */
    s->kv_type = kv_type == KV_F16 || kv_type == KV_Q8 ? kv_type : KV_F32;
    if (s->kv_type == KV_Q8 && c->head_dim % KV_Q8_GROUP != 0)
        return load_fail(e, "a q8 KV cache needs head_dim a multiple of %d; this model's is %d", KV_Q8_GROUP, c->head_dim);
    s->kv_row = kv_row_elems(s->kv_type, c->head_dim);
    s->kv_bytes = (size_t)((c->seq_len - 1) / kv_block_len(s->kv_type) + 1) * kv_block_elems(c, s) * kv_elem_bytes(s);
    s->key_cache = alloc_huge_anonymous(s->kv_bytes);
    s->value_cache = alloc_huge_anonymous(s->kv_bytes);
    int ok = s->key_cache && s->value_cache;
    for (size_t i = 0; ok && i < sizeof buffers / sizeof buffers[0]; i++)
        ok = (*buffers[i].buf = calloc(buffers[i].floats ? buffers[i].floats : 1, sizeof(float))) != NULL;
    s->expert_of = calloc(moe * B * k + 1, sizeof(int)), s->expert_rows = calloc(G * B + 1, sizeof(int)); /* ints */
    if (!ok || !s->expert_of || !s->expert_rows)
        return load_fail(e, "out of memory for the run state (a KV cache of %d positions: a shorter context needs less)",
                    c->seq_len);
    rope_tables(c, s->rope_cos, s->rope_sin);
    return 0;
}

/* The model's own ops (kernels/ops.h): options.threads threads (default the CPUs this process may
 * run on), scratch sized for the widest matrix, the largest batch and the whole context. */
static int start_ops(Transformer* t, const TransformerOptions* o, const LoadError* e) {
    const Config* c = &t->config;
    int widest = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    widest = widest > c->n_heads * c->head_dim ? widest : c->n_heads * c->head_dim;
    widest = widest > c->moe_hidden_dim ? widest : c->moe_hidden_dim;
    const OpsSpec spec = {.threads = o->threads, .max_batch = MAX_BATCH(c), .max_cols = widest, .max_pos = c->seq_len,
                          .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                          .bf16_activations = o->bf16_activations, .weights_bytes = t->header.weights_bytes,
                          .weights = o->prefill_only ? NULL : t->file + t->header.weights_offset,
                          .weight_type = c->weight_type, .weight_cols = c->dim, .group_size = c->group_size};
    t->ops = t->kernels = ops_new(&spec);
    if (!t->kernels) return load_fail(e, "out of memory for the kernels' threads and scratch");
    return 0;
}

int transformer_load(Transformer* t, const char* path, const TransformerOptions* opt, char* err, size_t errlen) {
    const TransformerOptions o = opt ? *opt : (TransformerOptions){0};
    const LoadError e = {path, err, errlen};
    memset(t, 0, sizeof *t);
    if (err && errlen) err[0] = '\0';
    if (checkpoint_map(t, &e) != 0) return -1;
    memcpy(&t->header, t->file, sizeof(FileHeader));
    if (checkpoint_config(t, o.ctx, &e) != 0 || checkpoint_weights(t, &e) != 0) {
        transformer_free(t);
        return -1;
    }
    /* after the checks, which read the header and the tensor table only: a file they refuse is not read whole */
    if (!o.lazy_pages) checkpoint_populate(t, o.load_progress, o.load_progress_ctx);
    if (start_ops(t, &o, &e) != 0 || alloc_state(t, o.kv_type, &e) != 0) {
        transformer_free(t);
        return -1;
    }
    t->tokenizer_data = t->file + t->header.tokenizer_offset;
    t->tokenizer_bytes = (size_t)t->header.tokenizer_bytes;
    return 0;
}

void transformer_free(Transformer* t) {
    if (t->file == NULL) return;
    ops_free(t->kernels);
    RunState* s = &t->state;
    void* buffers[] = {s->x, s->xb, s->q, s->k, s->v, s->att_out, s->proj, s->gate, s->up,
                       s->logits, s->rope_cos, s->rope_sin, s->router_logits,
                       s->expert_of, s->expert_weight, s->expert_in, s->expert_out, s->expert_rows};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) free(buffers[i]);
    free_huge_anonymous(s->key_cache, s->kv_bytes);
    free_huge_anonymous(s->value_cache, s->kv_bytes);
    free(t->weights.layers);
    free(t->weights.experts);
    munmap((void*)t->file, t->file_size);
    memset(t, 0, sizeof *t);
}

/* ---- The forward pass ---- */

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Maps the KV cache's pages below position `end` before a chunk writes them: one MADV_POPULATE_WRITE costs
 * a small part of a write fault per 4 KB page (docs/design.md#kv-cache). Memory stays the blocks reached (and
 * the rest of their last 2 MB page); where the call is missing or fails, the writes fault pages in. */
static void populate_kv_cache(Transformer* t, int end) {
#ifdef MADV_POPULATE_WRITE
    RunState* s = &t->state;
    const int seq_len = t->config.seq_len;
    if (end <= s->kv_populated) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const int bl = kv_block_len(s->kv_type);
    const size_t block = kv_block_elems(&t->config, s) * kv_elem_bytes(s);
    const int blocks = (end + bl - 1) / bl;
    char* const caches[2] = {(char*)s->key_cache, (char*)s->value_cache};
    for (int which = 0; which < 2; which++) {
        uintptr_t a = (uintptr_t)(caches[which] + (size_t)(s->kv_populated / bl) * block) & ~(page - 1);
        uintptr_t b = (uintptr_t)(caches[which] + (size_t)blocks * block);
        if (madvise((void*)a, b - a, MADV_POPULATE_WRITE) != 0) {
            s->kv_populated = seq_len; /* not supported here: leave it to the page faults */
            return;
        }
    }
    s->kv_populated = blocks * bl < seq_len ? blocks * bl : seq_len;
#endif
}

/* Row r of a batch buffer whose rows are `width` floats wide. */
#define ROW(buf, r, width) ((buf) + (size_t)(r) * (size_t)(width))

/* QWEN3.md 8, one row's routing as transformers' Qwen3MoeSparseMoeBlock computes it: the softmax of
 * its router logits over all E experts in fp32 (max subtracted), the k most probable (of equal
 * ones the lower index), and with norm_topk those k divided by their sum. */
static void choose_experts(const float* logits, int E, int k, int norm_topk, int* chosen, float* weight) {
    float max = logits[0], sum = 0.0f, chosen_sum = 0.0f;
    for (int e = 1; e < E; e++) max = logits[e] > max ? logits[e] : max;
    for (int e = 0; e < E; e++) sum += expf(logits[e] - max);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        chosen[j] = best;
        weight[j] = expf(logits[best] - max) / sum;
        chosen_sum += weight[j];
    }
    if (norm_topk)
        for (int j = 0; j < k; j++) weight[j] /= chosen_sum;
}

/* QWEN3.md 8, a mixture-of-experts layer's MLP on the normalised rows h (state.xb): each row's k
 * experts (choose_experts), then proj = sum over them of p_e down_e(silu(gate_e h) * up_e h). The
 * rows that chose an expert are gathered and go through it together (a chunk reads each chosen
 * expert's weights once, one no row chose not at all), EXPERTS_AT_ONCE experts per call to the ops;
 * the experts are summed in their index order, as transformers adds them. */
static void mixture_of_experts(Transformer* t, const LayerWeights* lw, int nb) {
    const Config* c = &t->config;
    RunState* s = &t->state;
    const Ops* ops = t->ops;
    const int D = c->dim, E = c->n_experts, k = c->n_experts_active, Fe = c->moe_hidden_dim;
    ops->matmul(ops, (float*[]){s->router_logits}, s->xb, (const Matrix*[]){&lw->router}, 1, nb);
    for (int r = 0; r < nb; r++)
        choose_experts(ROW(s->router_logits, r, E), E, k, c->moe_norm_topk, ROW(s->expert_of, r, k),
                       ROW(s->expert_weight, r, k));
    memset(s->proj, 0, (size_t)nb * D * sizeof(float));
    const Matrix *gates[EXPERTS_AT_ONCE], *ups[EXPERTS_AT_ONCE], *downs[EXPERTS_AT_ONCE];
    int ns[EXPERTS_AT_ONCE], n = 0, rows = 0; /* experts and rows gathered; expert_rows[i]: the (row, choice) of row i */
    for (int e = 0; e < E; e++) {
        const int first = rows;
        for (int rj = 0; rj < nb * k; rj++)
            if (s->expert_of[rj] == e) {
                s->expert_rows[rows] = rj;
                memcpy(ROW(s->expert_in, rows++, D), ROW(s->xb, rj / k, D), (size_t)D * sizeof(float));
            }
        if (rows > first) /* expert e takes the rows [first, rows) */
            gates[n] = &lw->expert_gate[e], ups[n] = &lw->expert_up[e], downs[n] = &lw->expert_down[e], ns[n++] = rows - first;
        if (n == 0 || (n < EXPERTS_AT_ONCE && e < E - 1)) continue;
        ops->matmul_segments(ops, s->gate, s->expert_in, gates, ns, n);
        ops->matmul_segments(ops, s->up, s->expert_in, ups, ns, n);
        for (int i = 0, r = 0; i < n; r += ns[i++]) /* expert by expert: swiglu counts in an int, which all the rows' Fe values together can pass */
            ops->swiglu(ops, ROW(s->gate, r, Fe), ROW(s->up, r, Fe), ns[i] * Fe);
        ops->matmul_segments(ops, s->expert_out, s->gate, downs, ns, n);
        for (int i = 0; i < rows; i++) {
            const float p = s->expert_weight[s->expert_rows[i]];
            float* out = ROW(s->proj, s->expert_rows[i] / k, D);
            for (int j = 0; j < D; j++) out[j] += p * ROW(s->expert_out, i, D)[j];
        }
        s->experts_run += n, n = rows = 0;
    }
}

float* forward(Transformer* t, const int* tokens, int n, int pos, float* all_logits) {
    const Config* c = &t->config;
    const Weights* w = &t->weights;
    RunState* s = &t->state;
    const Ops* ops = t->ops;                  /* the kernels (kernels/ops.h): nothing here knows which */
    const int D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    const int H = c->n_heads, K = c->n_kv_heads, d = c->head_dim;
    const int q_dim = H * d, kv_dim = K * d;  /* q is H*d wide, which is not D for 0.6B/4B/32B (7.1) */
    const float eps = c->rms_norm_eps;        /* from the header: 1e-6 for Qwen3, not 1e-5 (7.4) */

    /* Bad arguments return NULL instead of reading outside the cache or the embedding. */
    if (t->file == NULL || tokens == NULL || n <= 0 || pos < 0 || pos > c->seq_len - n) return NULL;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return NULL;

    /* Long inputs go through in chunks of max_batch rows. QWEN3.md 2.3: a batch is the decode step
     * applied to all rows at once, with a causal mask. A chunk's keys and values are in the cache
     * before its attention runs, so later chunks see earlier ones exactly as in one big batch. */
    for (int c0 = 0; c0 < n; c0 += s->max_batch) {
        const int nb = n - c0 < s->max_batch ? n - c0 : s->max_batch;  /* rows in this chunk */
        const int p0 = pos + c0;                                         /* position of its row 0 */
        populate_kv_cache(t, p0 + nb); /* map the cache pages this chunk writes in one call, not by faults */

        /* QWEN3.md 2.2 step 1: the embedding row of each token; no scaling, no BOS. */
        for (int r = 0; r < nb; r++) matrix_row(ROW(s->x, r, D), &w->embed_tokens, tokens[c0 + r]);

        for (int l = 0; l < L; l++) {
            const LayerWeights* lw = &w->layers[l];

            /* 2.2 step 2.1: pre-norm residual block: attention reads a normalised copy of each row of x. */
            ops->rmsnorm(ops, &(NormSite){1, "pre-attention", l, p0, nb, 1}, s->xb, s->x, lw->input_layernorm, D, eps);  /* RMSNorm use 1 of 4: pre-attention */

            /* 2.2 step 2.2: the q, k, v projections, in one call since they read the same input
             * (biases: Qwen2 only, QWEN3.md 6). */
            ops->matmul(ops, (float*[]){s->q, s->k, s->v}, s->xb,
                        (const Matrix*[]){&lw->q_proj, &lw->k_proj, &lw->v_proj}, 3, nb);
            if (lw->q_bias)
                for (int r = 0; r < nb; r++) {
                    for (int i = 0; i < q_dim; i++) ROW(s->q, r, q_dim)[i] += lw->q_bias[i];
                    for (int i = 0; i < kv_dim; i++) ROW(s->k, r, kv_dim)[i] += lw->k_bias[i];
                    for (int i = 0; i < kv_dim; i++) ROW(s->v, r, kv_dim)[i] += lw->v_bias[i];
                }

            /* 2.2 step 2.4: Qwen3's QK-Norm: q_norm [d] shared by every query head and k_norm by
             * every key head, each head normalised on its own, after the projection, before RoPE
             * (7.2); v is not normalised. A row of q is H heads of d values (k: K heads). */
            if (lw->q_norm) {
                ops->rmsnorm(ops, &(NormSite){2, "QK-Norm q", l, p0, nb, H}, s->q, s->q, lw->q_norm, d, eps);  /* RMSNorm use 2 of 4: QK-Norm on every q head (before RoPE) */
                ops->rmsnorm(ops, &(NormSite){2, "QK-Norm k", l, p0, nb, K}, s->k, s->k, lw->k_norm, d, eps);  /* RMSNorm use 2 of 4: QK-Norm on every k head (before RoPE) */
            }

            for (int r = 0; r < nb; r++) {
                /* 2.2 step 2.5: RoPE (section 2.4) at this row's position, pairs (i, i + d/2) (7.3). */
                const float* cos_p = ROW(s->rope_cos, p0 + r, d / 2);
                const float* sin_p = ROW(s->rope_sin, p0 + r, d / 2);
                ops->rope(ops, ROW(s->q, r, q_dim), H, d, cos_p, sin_p);
                ops->rope(ops, ROW(s->k, r, kv_dim), K, d, cos_p, sin_p);
                /* 2.2 step 2.6: the cache stores keys after QK-Norm and RoPE (7.5), in the cache's type. */
                for (int h = 0; h < K; h++) {
                    size_t at = kv_offset(c, s, l, h, p0 + r);
                    kv_store(s, s->key_cache, at, ROW(s->k, r, kv_dim) + h * d, d);
                    kv_store(s, s->value_cache, at, ROW(s->v, r, kv_dim) + h * d, d);
                }
            }

            /* 2.2 step 2.7: causal attention of every row and query head: query head j of row r
             * reads kv head j / (H / K) (GQA, 2.5) at positions 0 .. p0 + r, with scores scaled by
             * 1/sqrt(d), not by 1/sqrt(D / H) (7.1). */
            const size_t layer_at = kv_offset(c, s, l, 0, 0) * kv_elem_bytes(s);
            const KVRows cache = {.keys = (const char*)s->key_cache + layer_at,
                                  .values = (const char*)s->value_cache + layer_at, .stride = (int)s->kv_row,
                                  .block_len = kv_block_len(s->kv_type), .block_stride = kv_block_elems(c, s),
                                  .type = s->kv_type};
            ops->attention(ops, &(AttentionCall){.out = s->att_out, .q = s->q, .rows = nb, .p0 = p0, .n_heads = H,
                                                 .n_kv_heads = K, .head_dim = d, .scale = 1.0f / sqrtf((float)d),
                                                 .kv = cache, .layer = l,
                                                 .kv_head_step = kv_offset(c, s, l, 1, 0) - kv_offset(c, s, l, 0, 0)});

            /* 2.2 steps 2.8-2.9: output projection, residual add. */
            ops->matmul(ops, (float*[]){s->proj}, s->att_out, (const Matrix*[]){&lw->o_proj}, 1, nb);
            for (size_t i = 0; i < (size_t)nb * D; i++) s->x[i] += s->proj[i];

            /* 2.2 steps 2.10-2.12: SwiGLU MLP on a normalised copy of x, residual add; in Qwen3-MoE's
             * expert layers, the k experts its router chose for each row instead (QWEN3.md 8). */
            ops->rmsnorm(ops, &(NormSite){3, "pre-MLP", l, p0, nb, 1}, s->xb, s->x, lw->post_attention_layernorm, D, eps);  /* RMSNorm use 3 of 4: pre-MLP */
            if (lw->expert_gate) {
                mixture_of_experts(t, lw, nb);
            } else {
                ops->matmul(ops, (float*[]){s->gate, s->up}, s->xb, (const Matrix*[]){&lw->gate_proj, &lw->up_proj}, 2, nb);
                ops->swiglu(ops, s->gate, s->up, nb * F);  /* gate = silu(gate) * up */
                ops->matmul(ops, (float*[]){s->proj}, s->gate, (const Matrix*[]){&lw->down_proj}, 1, nb);
            }
            for (size_t i = 0; i < (size_t)nb * D; i++) s->x[i] += s->proj[i];
        }

        /* 2.2 steps 3-4: final norm and logits. Sampling needs only the last position (2.3), so
         * without all_logits only the last row of the last chunk goes through the head, the
         * biggest matmul of the model (V x D). */
        const int last_chunk = c0 + nb == n;
        if (!all_logits && !last_chunk) continue;
        const int r0 = all_logits ? 0 : nb - 1; /* the first row that needs logits */
        ops->rmsnorm(ops, &(NormSite){4, "final norm", -1, p0 + r0, nb - r0, 1}, ROW(s->xb, r0, D), ROW(s->x, r0, D), w->norm, D, eps);  /* RMSNorm use 4 of 4: final norm */
        float* logits = all_logits ? ROW(all_logits, c0, V) : s->logits;  /* the logits of rows r0 .. nb-1 */
        ops->matmul(ops, (float*[]){logits}, ROW(s->xb, r0, D), (const Matrix*[]){&w->lm_head}, 1, nb - r0);
        if (all_logits && last_chunk) memcpy(s->logits, ROW(logits, nb - 1, V), (size_t)V * sizeof(float));
    }
    return s->logits;
}
