/* model.h: the Qwen3 model: its config, its weights (pointers into the checkpoint file, whose
 * layout follows them), the table that names every tensor, the run state and the forward pass.
 * The limits first: the bounds of every config field. */
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* BEGIN CHECKPOINT LIMITS
 * The bounds the loader puts on the header's fields and the tokenizer section (checkpoint.c
 * checkpoint_config, tokenizer.c tokenizer_new): far above every real model (QWEN3.md 1.1), low enough that no size
 * computed from them can overflow. export.py holds the same table (LIMITS) and refuses a model
 * outside it, so that it never writes a file that ./run refuses; tests/test_export_input.py checks
 * that the two tables are equal. One plain #define per line: the test reads this block. */
#define MAX_DIM (1 << 16)            /* dim: 1 .. MAX_DIM */
#define MAX_HIDDEN (1 << 18)         /* hidden_dim, and n_heads * head_dim: 1 .. MAX_HIDDEN */
#define MAX_LAYERS 1024              /* n_layers: 1 .. MAX_LAYERS */
#define MAX_HEADS 1024               /* n_heads and n_kv_heads: 1 .. MAX_HEADS */
#define MAX_HEAD_DIM 1024            /* head_dim: 1 .. MAX_HEAD_DIM */
#define MAX_VOCAB (1 << 24)          /* vocab_size: 1 .. MAX_VOCAB; an added token's id: below it */
#define MAX_POSITIONS (1 << 24)      /* max_seq_len: 1 .. MAX_POSITIONS */
#define MAX_MATRIX_VALUES 2147483647 /* the widest width times the tallest height, at most (the
                                      * kernels index a matrix with int arithmetic) */
#define MAX_ROPE_THETA 1e30          /* rope_theta: at least 1, below MAX_ROPE_THETA */
#define MAX_ROPE_FACTOR 1e6          /* YaRN's factor: 1 .. MAX_ROPE_FACTOR; its attention factor and
                                      * betas: above 0, below it */
#define MAX_EOS_IDS 8                /* n_eos: 0 .. MAX_EOS_IDS */
#define MAX_EXPERTS 4096             /* n_experts: 1 .. MAX_EXPERTS; n_experts_active: 1 .. n_experts */
#define MAX_MLP_ONLY 8               /* mlp_only_layers: at most MAX_MLP_ONLY entries */
#define MAX_TEMPERATURE 100.0f       /* the temperature default: 0 .. MAX_TEMPERATURE */
#define MAX_TOP_P 1.0f               /* the top_p default: 0 .. MAX_TOP_P */
/* END CHECKPOINT LIMITS */

enum {
    FLAG_QK_NORM = 1,     /* q_norm/k_norm present: RMSNorm of every q and k head (Qwen3) */
    FLAG_QKV_BIAS = 2,    /* q/k/v projections have biases (Qwen2) */
    FLAG_TIED_EMBED = 4,  /* lm_head is embed_tokens */
    FLAG_ROPE_YARN = 8,   /* RoPE scaled by YaRN (QWEN3.md 2.9): the header's rope_* fields */
    FLAG_MOE = 16,        /* Qwen3-MoE (QWEN3.md 8): the header's moe_* fields; mixture-of-experts layers */
};

typedef struct {
    int dim;           /* hidden_size D: the residual stream's width, what RMSNorm normalises */
    int hidden_dim;    /* intermediate_size F: the MLP's width (llama2.c's name; not hidden_size) */
    int n_layers, n_heads, n_kv_heads, head_dim, vocab_size;
    int max_seq_len;   /* the model's maximum context (max_position_embeddings) */
    int seq_len;       /* the KV cache size actually allocated (-c/--ctx, at most max_seq_len) */
    float rms_norm_eps;
    double rope_theta;
    /* YaRN (flags & FLAG_ROPE_YARN): the header's rope_* fields */
    float rope_factor, rope_beta_fast, rope_beta_slow, rope_attention_factor;
    int rope_original_max, rope_truncate;
    /* Qwen3-MoE (flags & FLAG_MOE): the header's moe_* fields; config_layer_is_moe says which layers */
    int n_experts, n_experts_active, moe_hidden_dim, moe_sparse_step, moe_norm_topk, n_mlp_only;
    int mlp_only[MAX_MLP_ONLY];
    int flags;
    WeightType weight_type;
    int group_size;
} Config;

typedef struct {
    const float* input_layernorm;           /* [dim]  RMSNorm before attention */
    Matrix q_proj, k_proj, v_proj;          /* [H*d, dim], [K*d, dim], [K*d, dim] */
    const float *q_bias, *k_bias, *v_bias;  /* NULL unless FLAG_QKV_BIAS */
    const float *q_norm, *k_norm;           /* [head_dim], NULL unless FLAG_QK_NORM */
    Matrix o_proj;                          /* [dim, H*d] */
    const float* post_attention_layernorm;  /* [dim]  RMSNorm before the MLP */
    Matrix gate_proj, up_proj, down_proj;   /* [F, dim], [F, dim], [dim, F]; a dense layer's MLP */
    /* a mixture-of-experts layer's MLP (QWEN3.md 8) instead: the router, float32 in every format,
     * and each expert's SwiGLU MLP, [E] matrices each ([Fe, dim], [Fe, dim], [dim, Fe]) */
    Matrix router;                          /* [E, dim] */
    Matrix *expert_gate, *expert_up, *expert_down;
} LayerWeights;

/* Every weight is a pointer into the mapped file: nothing is copied at load. */
typedef struct {
    Matrix embed_tokens;   /* [vocab, dim] */
    LayerWeights* layers;  /* [n_layers] structs of pointers: the weights' only allocation, with */
    Matrix* experts;       /* [3 * E * the mixture-of-experts layers] the experts' (Qwen3-MoE) */
    const float* norm;     /* [dim]  final RMSNorm */
    Matrix lm_head;        /* [vocab, dim]; equals embed_tokens for tied models */
} Weights;

/* ---------------------------------------------------------------------------------------------
 * THE CHECKPOINT FILE (written by export.py, mapped by checkpoint.c; all numbers little-endian)
 * ---------------------------------------------------------------------------------------------
 *
 *   offset 0     FileHeader (256 bytes, struct below)
 *   ...          tokenizer section  [header.tokenizer_offset, + header.tokenizer_bytes)
 *   ...          tensors            [header.weights_offset,   + header.weights_bytes)
 *
 * Tensors follow one another in the order of the table TENSORS (model.c; docs/checkpoint.md shows
 * it), each at a file offset that is a multiple of 64 (zero bytes between), so the engine points
 * into the mapped file without copying: to find a tensor by hand, walk the table from
 * weights_offset, rounding each start up to 64.
 *
 * A MATRIX [rows, cols] is stored row-major ([out_features, in_features], as in PyTorch's
 * nn.Linear) in the header's weight_type:
 *   WEIGHT_F32   rows*cols float32
 *   WEIGHT_BF16  rows*cols bfloat16 (the top 16 bits of a float32)
 *   WEIGHT_Q8    int8 q in groups of gs = group_size consecutive columns of a row, one float16
 *                scale s per group: w = s * q (export.py: s = max|w| / 127 rounded to float16,
 *                q = round(w / s)). cols is a multiple of gs; G = cols / gs. Stored in blocks of
 *                4 rows (the last padded with zero rows); block b holds rows 4b .. 4b+3:
 *                  float16 s[4][G]          the scales of row 4b+i, group g at s[i][g]
 *                  int8    q[G][4][gs]      group g of row 4b+i at q[g][i]
 *                so a block is 4*cols + 8*G bytes, read front to back by the matrix-vector
 *                kernel as one stream (kernels.h: quant_scales, quant_group).
 *   WEIGHT_Q4    4-bit q in [-8, 7] in groups of gs = 32 columns, one float16 scale s per group:
 *                w = s * q (export.py, as llama.cpp's q4_0: m = the group's value of largest
 *                magnitude, q = round(w * -8 / m) clipped to 7, s = m / -8 rounded to float16),
 *                stored as q + 8. In blocks of 8 rows (the last padded with zero rows); block b
 *                holds rows 8b .. 8b+7 as G groups of 144 bytes, group g:
 *                  float16 s[8]             the scales of row 8b+i, group g at s[i]
 *                  uint8   q[4][8][4]       q[v][i][k]: row 8b+i, column 32g + 4v + k in the low
 *                                           nibble, column 32g + 16 + 4v + k in the high nibble
 *                so the 32-bit lane i of each 32-byte quarter v is one row (kernels.h: q4_group).
 *                A block is 4*cols + 16*G bytes (4.5 bits per weight).
 * Norm weights and biases are always float32 (they are tiny, and bf16 -> f32 is exact).
 *
 * The tokenizer section (tokenizer/tokenizer.h draws its layout) holds the vocabulary, the merges,
 * the added tokens and the chat template. A bad file is one error line that names the file and the
 * problem, never a crash (checkpoint.c checks every size and offset against the file).
 */
#define CHECKPOINT_MAGIC "QW3C"
#define CHECKPOINT_VERSION 5
#define CHECKPOINT_ALIGN 64

enum { ARCH_QWEN3 = 1, ARCH_QWEN2 = 2, ARCH_LLAMA = 3, ARCH_QWEN3_MOE = 4 };

/* The first 256 bytes of the file. Every field is 4 or 8 bytes and placed so that the struct has
 * no implicit padding; export.py writes it with the struct format
 * '<4s13I f i d I 8i f f i 2I 4Q f I f f f I 6I 8I 16x'. */
typedef struct {
    char magic[4];            /* "QW3C" */
    uint32_t version;         /* CHECKPOINT_VERSION */
    uint32_t arch;            /* ARCH_*: which Hugging Face class it came from (informational) */
    uint32_t flags;           /* FLAG_* */
    uint32_t dim;             /* hidden_size D */
    uint32_t hidden_dim;      /* intermediate_size F */
    uint32_t n_layers;        /* num_hidden_layers L */
    uint32_t n_heads;         /* num_attention_heads H */
    uint32_t n_kv_heads;      /* num_key_value_heads K */
    uint32_t head_dim;        /* head_dim d (NOT always dim / n_heads) */
    uint32_t vocab_size;      /* rows of embed_tokens and lm_head */
    uint32_t max_seq_len;     /* max_position_embeddings */
    uint32_t weight_type;     /* WEIGHT_F32 / WEIGHT_BF16 / WEIGHT_Q8 / WEIGHT_Q4 */
    uint32_t group_size;      /* q8 / q4 group size (0 otherwise) */
    float rms_norm_eps;       /* epsilon inside the square root of every RMSNorm */
    int32_t bos_id;           /* -1: none (Qwen3 adds no BOS) */
    double rope_theta;        /* RoPE base */
    uint32_t n_eos;           /* how many of eos_ids are used */
    int32_t eos_ids[MAX_EOS_IDS];  /* generation stops at any of these */
    float temperature;        /* generation_config defaults (0 when absent) */
    float top_p;
    int32_t top_k;
    uint32_t reserved0, reserved1;
    uint64_t tokenizer_offset, tokenizer_bytes;  /* the tokenizer section: its file offset and length */
    uint64_t weights_offset, weights_bytes;      /* the tensors: their section's file offset and length */
    /* YaRN (FLAG_ROPE_YARN; zero without it), as config.json's rope_scaling gives it (QWEN3.md 2.9) */
    float rope_factor;            /* s: the context's scale over the original */
    uint32_t rope_original_max;   /* L: original_max_position_embeddings */
    float rope_beta_fast, rope_beta_slow; /* the ramp's ends, in rotations over L (32 and 1 by default) */
    float rope_attention_factor;  /* cos and sin are multiplied by it (0.1 ln s + 1 by default) */
    uint32_t rope_truncate;       /* 1: the ramp's ends rounded to whole dimensions (the default) */
    /* Qwen3-MoE (FLAG_MOE; zero without it): layer l is a mixture of experts unless it is one of
     * mlp_only's, or (l + 1) is not a multiple of moe_sparse_step (transformers' rule) */
    uint32_t n_experts;           /* E: num_experts */
    uint32_t n_experts_active;    /* k: num_experts_per_tok, the experts each token goes through */
    uint32_t moe_hidden_dim;      /* each expert's width: moe_intermediate_size */
    uint32_t moe_sparse_step;     /* decoder_sparse_step */
    uint32_t moe_norm_topk;       /* 1: the k probabilities divided by their sum (norm_topk_prob) */
    uint32_t n_mlp_only;          /* entries of mlp_only */
    uint32_t mlp_only[MAX_MLP_ONLY]; /* layers kept dense (mlp_only_layers) */
    uint8_t reserved[256 - 240];  /* zero */
} FileHeader;

_Static_assert(sizeof(FileHeader) == 256, "FileHeader must be exactly 256 bytes");

/* ---- Every tensor of the checkpoint, named once ----
 * TENSORS (model.c) lists them in file order: the loader maps them from it, quantize writes them,
 * the bench counts the bytes a token reads, export.py mirrors it (its TENSORS) and
 * tests/test_tensor_table.py checks both and docs/checkpoint.md against it. A new tensor is a row
 * there and in export.py, a field of (Layer)Weights and its use in forward() (which only the tests'
 * reference checks); a new condition for it, a FLAG_* bit (check_format, export's file_flags). */
typedef enum { SIZE_NONE, SIZE_DIM, SIZE_HIDDEN, SIZE_VOCAB, SIZE_Q, SIZE_KV, SIZE_HEAD, SIZE_EXPERTS, SIZE_EXPERT_HIDDEN } TensorSize;

/* Where a tensor is: once (embed_tokens before the layers, the others after them), in every
 * layer, or in every layer once per expert (a run of such rows repeats, expert by expert). */
enum { GLOBAL, LAYER, EXPERT };
/* Set, for only_with / not_with, beside the file's FLAG_* bits in a layer whose MLP is a mixture of
 * experts: its router and experts are stored and its dense MLP is not (model.c, TENSORS). */
#define FLAG_MOE_LAYER (1 << 16)

typedef struct {
    const char* name;
    int place;              /* GLOBAL, LAYER or EXPERT */
    TensorSize rows, cols;  /* cols SIZE_NONE: a float32 vector of rows values; else a MATRIX */
    int only_with;          /* FLAG_* bits the file (and layer) must have for the tensor to be stored */
    int not_with;           /* FLAG_* bits with which it is not stored */
    int float32;            /* 1: a MATRIX stored as float32 whatever the weight type (the router) */
    size_t field;           /* where its pointer goes: offsetof(LayerWeights or Weights, ...); for
                             * EXPERT rows, of the Matrix* array */
} TensorInfo;

extern const TensorInfo TENSORS[];
extern const int N_TENSORS;

int tensor_size(TensorSize s, const Config* c);          /* dim, hidden_dim, ... of c; 1 for SIZE_NONE */
/* Whether layer l of c is a mixture of experts (Qwen3-MoE; transformers' rule). */
int config_layer_is_moe(const Config* c, int l);

/* Activations for a batch of up to max_batch positions, and the KV cache. Allocated once at load;
 * the token loop allocates nothing. Row t of a batch buffer is at buf + t * width. */
typedef struct {
    int max_batch;
    float* x;        /* [B, dim]   the residual stream */
    float* xb;       /* [B, dim]   h: normalised input of attention / MLP / lm_head (the final norm) */
    float *q, *k, *v;  /* [B, H*d], [B, K*d], [B, K*d] */
    float* att_out;  /* [B, H*d]   o: attention output, before o_proj */
    float* proj;     /* [B, dim]   o_proj / down_proj output, before the residual add */
    float *gate, *up; /* [B, F]   Wgate h and Wup h; swiglu leaves silu(Wgate h) * Wup h in gate for down_proj */
    /* Qwen3-MoE: each row's router logits [B, E], its k experts and weights [B, k], and the rows
     * one call of experts takes, gathered (model.c: up to B * min(k, EXPERTS_AT_ONCE), also in gate, up) */
    float* router_logits;
    int* expert_of;
    float* expert_weight;
    float *expert_in, *expert_out;
    int* expert_rows;
    long long experts_run; /* (layer, chunk, expert some row chose) so far: for -m bench's count */
    float* logits;   /* [vocab]    logits of the last position */
    void *key_cache, *value_cache; /* [seq_len / kv_block_len (rounded up), L, K, kv_block_len, kv_row]
                                    * keys after QK-Norm and RoPE, and values, in blocks of positions (model.c, kv_offset) */
    KVType kv_type;      /* the caches' elements: KV_F32, KV_F16 or KV_Q8 (kernels.h) */
    size_t kv_row, kv_bytes; /* elements of one cached row (a position of a kv head: d, and for q8 its scales,
                              * kernels.h kv_row_elems), bytes of either cache */
    int kv_populated;    /* cache pages of positions below this are mapped (populate_kv_cache) */
    float *rope_cos, *rope_sin; /* [seq_len, d/2]  cos and sin of p * inv_freq[i] (with YaRN each times the
                                 * attention factor: model.c, rope_tables) */
} RunState;

/* Positions per KV cache block (model.c): fp16's and q8's rows are short, so more (docs/design.md#kv-cache). */
static inline int kv_block_len(KVType t) { return t == KV_F32 ? 128 : 512; }

static inline size_t kv_elem_bytes(const RunState* s) { return kv_elem_size(s->kv_type); }

/* The KV cache's positions when the caller gives no context length, at most the model's (QWEN3.md
 * 1.1: the models allow 40,960 positions, but a cache that large costs 9 GB in fp32 for 0.6B). */
#define DEFAULT_CTX 4096

/* How transformer_load sets a model up; all zero is the default; nothing else changes a load. */
typedef struct {
    int threads;          /* kernel threads, the caller's included; <= 0: one per CPU this process may run on */
    int ctx;              /* KV cache positions; <= 0: min(DEFAULT_CTX, max_seq_len); above max_seq_len: clamped to it */
    KVType kv_type;       /* the KV cache's elements (kernels.h): KV_F32 (0, what the reference computes),
                           * KV_F16 (llama.cpp's default: half the bytes) or KV_Q8 (9/32 of fp32's) */
    int bf16_activations; /* 1: prefill with bf16 weights rounds the activations to bf16 (fast/fast.h)
                           * where the build has the instruction: t->kernels->bf16_activations says */
    int prefill_only;     /* 1: no token is decoded (eval, tokenize, quantize): decode's prefetch is not timed */
    /* The checked file is read into memory whole at load, a piece at a time, which takes as long as
     * the disk needs where the page cache does not hold it (17 GB for Qwen3-30B-A3B in q4):
     * load_progress(load_progress_ctx, bytes done, file size) between pieces, where not NULL. */
    void (*load_progress)(void* ctx, size_t done, size_t total);
    void* load_progress_ctx;
    int lazy_pages;       /* 1: not read whole; pages come in as they are read (quantize, which reads each
                           * weight once, and tokenize, which reads none: a file larger than memory read
                           * ahead would be read twice) */
} TransformerOptions;

typedef struct {
    Config config;
    Weights weights;
    RunState state;
    FileHeader header;        /* a copy of the file's header */
    const uint8_t* tokenizer_data;  /* the tokenizer section, inside the mapping */
    size_t tokenizer_bytes;
    const uint8_t* file;      /* the checkpoint, mapped read-only at a 2 MB boundary (checkpoint.c, map_file) */
    size_t file_size;
    Ops* kernels;             /* this model's own ops (kernels/ops.h: the fast ones, or the reference build's) */
    const Ops* ops;           /* what forward() calls: kernels, or a tool's table in front of them
                               * (the RMSNorm lab, the --show-norms trace; cli/norm_lab.h, cli/norm_trace.h) */
} Transformer;

/* Maps and validates the checkpoint, starts the model's own kernel threads and allocates its run
 * state with a KV cache of opt->ctx positions (opt NULL: every option at its default). Models
 * loaded in one process share nothing: they run side by side and free in either order.
 * Returns 0, or -1 after writing one line "PATH: problem" into err. */
int transformer_load(Transformer* t, const char* path, const TransformerOptions* opt, char* err, size_t errlen);
void transformer_free(Transformer* t);

/* Runs n tokens at positions pos .. pos+n-1 through the model (prefill when n > 1, decode when
 * n == 1), appending their keys and values to the KV cache. pos + n must be <= config.seq_len.
 * If all_logits is not NULL it receives n * vocab_size logits (every position); the last
 * position's logits are always in state.logits, which is also returned. Returns NULL, changing
 * nothing, for arguments outside these bounds (n <= 0, pos < 0, a token outside the vocabulary). */
float* forward(Transformer* t, const int* tokens, int n, int pos, float* all_logits);

#endif
