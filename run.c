/* run.c: the command line of the engine (llama2.c's flags, plus a few).
 *
 *   ./run MODEL.bin [options]          (./run --help lists them)
 *
 * Modes: generate (default) continues a prompt; tokenize prints the ids of a text; chat, bench and
 * eval are in chat.c, bench.c and eval.c. The test contract that other tools depend on:
 *   --prompt-ids 9707,11,1879   the prompt as token ids (exactly these, no BOS added)
 *   --dump-logits PATH          raw little-endian float32 logits, vocab_size per row: one row for
 *                               every prompt position, then one for every generated token
 *   -n 0                        process the prompt, generate nothing
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>

#include "cli/bench.h"
#include "cli/chat.h"
#include "cli/eval.h"
#include "model.h"
#include "cli/norm_trace.h"
#include "cli/quantize.h"
#include "cli/read_all.h"
#include "cli/sampler.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char* checkpoint;
    const char* mode;          /* generate | chat | tokenize | bench | eval */
    const char* prompt;        /* -i */
    const char* prompt_ids;    /* --prompt-ids */
    const char* system_prompt; /* -y */
    const char* dump_logits;   /* --dump-logits */
    const char* bench_args[12]; /* bench mode's options, normalised for bench_main (bench.h) */
    int n_bench_args;
    float temperature, top_p, min_p, repeat_penalty;
    int top_k, steps, threads, ctx;
    const char* thread_counts;   /* --threads as given: a list of counts in bench mode */
    int n_thread_counts;
    int thinking, show_thinking, keep_thinking, verbose_prompt; /* chat mode */
    int no_mmap;                 /* read the weights into memory instead of mapping them */
    int refill_page_cache;       /* --refill-page-cache: TransformerOptions.refill_page_cache */
    int kv_f16;                  /* --kv-cache f16: keys and values cached as IEEE halves */
    int bf16_activations;        /* prefill: bf16 weights x bf16-rounded activations */
    int show_norms;              /* --show-norms: every RMSNorm call site at the prompt's last token;
                                  * 2 (--show-norms=all): at every position, every head */
    const char* norms_json;      /* --norms-json PATH: the same, all of it, as JSON lines */
    const char* file;            /* --file: eval mode's text */
    int json;                    /* --json: bench and eval mode */
    NormLab norm_lab;            /* --ablate, --norm-eps, --norm: the RMSNorm lab (model.h) */
    uint64_t seed;
    int has_temperature, has_top_p, has_top_k, has_seed, has_steps;
    const char* given[48];       /* the options given, by their long names: for the other-mode notes */
    int n_given;
} Options;

static void usage(FILE* out) {
    fprintf(out,
            "Usage:   ./run MODEL.bin [options]\n"
            "Example: ./run model.bin -n 256 -i \"Once upon a time\"\n"
            "Options:\n"
            "  -t, --temperature T    sampling temperature in [0,100]; 0 = greedy (default: the model's\n"
            "                         generation_config, else 1.0)\n"
            "  -p, --top-p P          top-p (nucleus) sampling in [0,1]; 0 or 1 = off (default: the\n"
            "                         model's, else 0.9)\n"
            "  -k, --top-k K          keep the K most likely tokens; 0 = off (default: the model's)\n"
            "      --min-p P          drop tokens below P * the top probability, [0,1]; 0 = off (default)\n"
            "      --repeat-penalty R repetition penalty over every token seen, (0,100]; 1 = off (default)\n"
            "  -s, --seed S           random seed, a non-negative integer (default: from the clock in\n"
            "                         nanoseconds, printed at the end of a sampled generation)\n"
            "  -n, --steps N          tokens to generate, >= 0; 0 = only process the prompt (default 256;\n"
            "                         chat mode: per answer, 0 or default = until the context is full)\n"
            "  -i, --input TEXT       the prompt (tokenize mode: the text; default: standard input)\n"
            "      --prompt-ids IDS   the prompt as comma-separated token ids, e.g. 9707,11,1879\n"
            "                         (generate mode; eval mode: the tokens to score)\n"
            "  -m, --mode MODE        generate | chat | tokenize | bench | eval (default generate); chat\n"
            "                         reads one message per line (/help lists its commands); eval\n"
            "                         scores a text (-i, --file or standard input; or --prompt-ids) in\n"
            "                         windows of -c tokens: loss (nats/token), perplexity, top-1\n"
            "  -y, --system TEXT      system prompt (chat mode)\n"
            "      --no-think         chat mode: switch thinking off (the template's empty think\n"
            "                         block; same as --thinking 0)\n"
            "      --hide-think       chat mode: do not print the thinking (same as --show-thinking 0)\n"
            "      --thinking 0|1     chat mode: 1 = Qwen3's thinking mode (default), 0 = no-think\n"
            "      --show-thinking 0|1  chat mode: print the thinking (default 1) or hide it\n"
            "      --keep-thinking    chat mode: keep earlier answers' thinking in the context and\n"
            "                         run only each turn's new text (default: each turn's prompt is\n"
            "                         the template's, which drops it; the cache is reused up to\n"
            "                         where the two differ)\n"
            "      --verbose-prompt   print the prompt's token ids to stderr (chat mode: each turn's,\n"
            "                         with how many were already cached, and the answer's)\n"
            "  -c, --ctx N            context length (KV cache positions); 0 = min(4096, the model's)\n"
            "      --no-mmap          read the weights into memory (huge pages) instead of mapping\n"
            "                         the file: faster decode where page-cache reads are slow\n"
            "      --refill-page-cache  model file cached in 4 KB pages: drop it from the system's page\n"
            "                         cache and read it again in 2 MB pages: faster decode on some VMs\n"
            "      --kv-cache f32|f16 the KV cache's element type (default f32, the reference's);\n"
            "                         f16 halves its memory and decode attention's reads (llama.cpp's\n"
            "                         default), keys and values rounded to 11 significant bits\n"
            "      --bf16-activations prefill of a bf16 model rounds the activations to bf16 and uses\n"
            "                         the CPU's bf16 dot product (AVX-512 BF16): llama.cpp's precision,\n"
            "                         faster on Zen 4 and with AMX; ignored with a note where the\n"
            "                         build has none\n"
            "      --threads N        worker threads (default and most: one per CPU this process may\n"
            "                         run on); bench mode takes a list, e.g. 1,2: the counts take\n"
            "                         turns rep by rep\n"
            "      --dump-logits PATH write the logits of every prompt position and every generated\n"
            "                         token as raw little-endian float32 (vocab_size per row)\n"
            "      --show-norms       generate mode: print to stderr what each RMSNorm call site\n"
            "                         (pre-attention, QK-Norm, pre-MLP, final) does at the prompt's\n"
            "                         last token: rms in, scale, rms(w), rms out\n"
            "      --show-norms=all   the same at every position, every head of q and k on its own\n"
            "      --norms-json PATH  generate mode: write every RMSNorm call site at every position\n"
            "                         and head, and each head's largest |q.k|/sqrt(d), as JSON lines\n"
            "                         (tools/plot_norms.py draws them)\n"
            "      --file PATH        eval mode: the text to score (default: -i, else standard input)\n"
            "      --json             eval mode: one line {\"tokens\": N, \"loss\": X, \"ppl\": Y, \"top1\": Z}\n"
            "RMSNorm lab (generate, chat and eval; each changes the model, for teaching):\n"
            "      --ablate LIST      leave out RMSNorm uses, comma-separated: qk-norm, final-norm,\n"
            "                         pre-norms (pre-attention and pre-MLP), norm-weight (w = 1:\n"
            "                         scale only), norm-scale (the weight only: no 1/rms)\n"
            "      --norm-eps X       eps inside every RMSNorm's square root instead of the model's\n"
            "      --norm rmsnorm|layernorm  layernorm: subtract the vector's mean first (LayerNorm\n"
            "                         without a bias); rmsnorm (default): the model as trained\n"
            "  -h, --help             this help\n"
            "Bench mode (-m bench): --bench-prompt N (prefill tokens, default 512), --bench-gen N\n"
            "  (decode tokens, default 128; both defaults shrink to fit the context, with a note),\n"
            "  --bench-reps N (default 5), --bench-depth N (positions already in the KV cache when\n"
            "  each test starts, as llama-bench -d; default 0), --json (JSON lines)\n"
            "Quantize mode (-m quantize): ./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin writes an\n"
            "  f32 or bf16 checkpoint as q8 or q4 (./run -m quantize --help)\n"
            "Environment: KERNELS_SPIN_US (idle threads' spin before sleeping, default 200),\n"
            "  KERNELS_PREFETCH (near|mid: decode's weight prefetch, default from the CPU),\n"
            "  KERNELS_AMX=0 (prefill on the AVX-512 kernels instead of AMX tiles, where the CPU has AMX),\n"
            "  BENCH_LLC_BYTES (the last-level cache size the bench compares decode's bytes per token\n"
            "  with, default from /sys; 0 = always give decode's %% of roof)\n");
}

/* One-line error and exit (status 2: bad command line; 1: anything else). */
static void die(int status, const char* fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(status);
}

/* Output that could not be written (a full disk, a pipe closed while SIGPIPE is ignored) ends the
 * run with an error instead of a silent success. */
static void check_stdout(void) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        die(1, "standard output: write failed%s%s", errno ? ": " : "", errno ? strerror(errno) : "");
}

/* A number in [lo, hi], or in (lo, hi] when lo_open; anything else ends the run with a message that
 * states that range. A value too large for a float ("1e39") is out of the range, not "not a number". */
static float parse_float(const char* flag, const char* s, float lo, float hi, int lo_open) {
    char* end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end != '\0' || isnan(v)) die(2, "%s needs a number, got '%s'", flag, s);
    /* ERANGE with a finite result is an underflow: a value as close to 0 as a float gets */
    if ((errno == ERANGE && isinf(v)) || v < lo || v > hi || (lo_open && v == lo))
        die(2, "%s must be in %c%g, %g], got %s", flag, lo_open ? '(' : '[', lo, hi, s);
    return v;
}

static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') die(2, "%s needs an integer, got '%s'", flag, s);
    if (errno == ERANGE || v < lo || v > hi) die(2, "%s must be in [%lld, %lld], got %s", flag, lo, hi, s);
    return v;
}

static uint64_t parse_seed(const char* flag, const char* s) {
    char* end;
    errno = 0;
    if (*s == '-' || *s == '+') die(2, "%s needs a non-negative integer, got '%s'", flag, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        die(2, "%s needs a non-negative integer, got '%s'", flag, s);
    return (uint64_t)v;
}

/* Remembers an option given (its long name, once) for warn_other_mode's notes. */
static void note_given(Options* o, const char* long_name) {
    for (int k = 0; k < o->n_given; k++)
        if (strcmp(o->given[k], long_name) == 0) return;
    if (o->n_given < (int)(sizeof o->given / sizeof o->given[0])) o->given[o->n_given++] = long_name;
}

/* One note naming the options given from `names` (NULL-terminated), which do nothing in this
 * mode: "run: note: -m tokenize ignores --seed and --steps (generate and chat options)". */
static void warn_other_mode(const Options* o, const char* const* names, const char* whose) {
    const char* hit[48];
    int n = 0;
    for (int k = 0; k < o->n_given; k++)
        for (const char* const* p = names; *p; p++)
            if (strcmp(o->given[k], *p) == 0) hit[n++] = *p;
    if (n == 0) return;
    fprintf(stderr, "run: note: -m %s ignores ", o->mode);
    for (int k = 0; k < n; k++) fprintf(stderr, "%s%s", k == 0 ? "" : k == n - 1 ? " and " : ", ", hit[k]);
    fprintf(stderr, " (%s option%s)\n", whose, n > 1 ? "s" : "");
}

/* --ablate LIST: the RMSNorm uses to leave out or change (model.h NormLab), comma-separated. */
static void parse_ablate(const char* list, NormLab* lab) {
    static const struct { const char* name; int skip, variant; } ablations[] = {
        {"qk-norm", NORM_SKIP_QK, 0},          {"final-norm", NORM_SKIP_FINAL, 0},
        {"pre-norms", NORM_SKIP_PRE, 0},       {"norm-weight", 0, NORM_VARIANT_UNIT_WEIGHT},
        {"norm-scale", 0, NORM_VARIANT_NO_SCALE},
    };
    const size_t n_ablations = sizeof ablations / sizeof ablations[0];
    for (const char* item = list;; item++) {
        size_t len = strcspn(item, ",");
        size_t k = 0;
        while (k < n_ablations && !(strlen(ablations[k].name) == len && strncmp(item, ablations[k].name, len) == 0)) k++;
        if (k == n_ablations)
            die(2, "--ablate: unknown name '%.*s' (valid: qk-norm, final-norm, pre-norms, norm-weight, norm-scale)",
                (int)len, item);
        lab->skip |= ablations[k].skip;
        lab->variant |= ablations[k].variant;
        item += len;
        if (*item == '\0') break;
    }
}

/* Options without a value: each sets one field. Returns the field of the switch called name (and
 * the value it sets in *value), or NULL when name is none. */
static int* switch_field(Options* o, const char* name, int* value) {
    const struct { const char* name; int* field; int value; } switches[] = {
        {"--keep-thinking", &o->keep_thinking, 1},
        {"--verbose-prompt", &o->verbose_prompt, 1},
        {"--no-think", &o->thinking, 0}, /* chat: the official template's switch-off */
        {"--hide-think", &o->show_thinking, 0},
        {"--no-mmap", &o->no_mmap, 1},
        {"--refill-page-cache", &o->refill_page_cache, 1},
        {"--bf16-activations", &o->bf16_activations, 1},
        {"--show-norms", &o->show_norms, 1},
    };
    for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++) {
        if (strcmp(name, switches[k].name) == 0) {
            *value = switches[k].value;
            return switches[k].field;
        }
    }
    return NULL;
}

/* The options that take a value, and their short names ("" where none). */
static const struct { const char* short_name; const char* long_name; } valued_options[] = {
    {"-t", "--temperature"}, {"-p", "--top-p"}, {"-k", "--top-k"}, {"", "--min-p"},
    {"", "--repeat-penalty"}, {"-s", "--seed"}, {"-n", "--steps"}, {"-i", "--input"},
    {"", "--prompt-ids"}, {"-m", "--mode"}, {"-y", "--system"}, {"-c", "--ctx"},
    {"", "--threads"}, {"", "--dump-logits"}, {"", "--bench-prompt"}, {"", "--bench-gen"},
    {"", "--bench-reps"}, {"", "--bench-depth"}, {"", "--thinking"}, {"", "--show-thinking"},
    {"", "--kv-cache"}, {"", "--norms-json"}, {"", "--file"}, {"", "--ablate"}, {"", "--norm-eps"},
    {"", "--norm"},
};

/* The long name of the option with a value that name (short or long) is, or NULL. */
static const char* valued_long_name(const char* name) {
    for (size_t k = 0; k < sizeof valued_options / sizeof valued_options[0]; k++) {
        const char* short_name = valued_options[k].short_name;
        if ((short_name[0] && strcmp(name, short_name) == 0) || strcmp(name, valued_options[k].long_name) == 0)
            return valued_options[k].long_name;
    }
    return NULL;
}

/* Appends to the options run.c passes on to bench_main. */
static void add_bench_args(Options* o, const char* a, const char* b) {
    const int n = b ? 2 : 1;
    if (o->n_bench_args + n > (int)(sizeof o->bench_args / sizeof o->bench_args[0])) die(2, "too many bench options");
    o->bench_args[o->n_bench_args++] = a;
    if (b) o->bench_args[o->n_bench_args++] = b;
}

/* An option without a value (a switch, --show-norms=all or --json); returns 0 when arg is none. */
static int parse_switch(Options* o, const char* arg) {
    if (strcmp(arg, "--show-norms=all") == 0) { /* the one switch that also takes a value */
        o->show_norms = 2;
        note_given(o, "--show-norms");
        return 1;
    }
    int value;
    int* field = switch_field(o, arg, &value);
    if (field) {
        *field = value;
        note_given(o, arg);
        return 1;
    }
    if (strcmp(arg, "--json") == 0) { /* bench and eval mode's only option without a value */
        note_given(o, arg);
        o->json = 1;
        add_bench_args(o, arg, NULL);
        return 1;
    }
    return 0;
}

/* The sampler's options and -n; returns 0 when long_name is none of them. name is the option as
 * given (short or long), for the messages. */
static int set_sampling_option(Options* o, const char* long_name, const char* name, const char* value) {
    if (strcmp(long_name, "--temperature") == 0) {
        o->temperature = parse_float(name, value, 0.0f, 100.0f, 0);
        o->has_temperature = 1;
    } else if (strcmp(long_name, "--top-p") == 0) {
        o->top_p = parse_float(name, value, 0.0f, 1.0f, 0);
        o->has_top_p = 1;
    } else if (strcmp(long_name, "--top-k") == 0) {
        o->top_k = (int)parse_int(name, value, 0, INT_MAX);
        o->has_top_k = 1;
    } else if (strcmp(long_name, "--min-p") == 0) {
        o->min_p = parse_float(name, value, 0.0f, 1.0f, 0);
    } else if (strcmp(long_name, "--repeat-penalty") == 0) {
        o->repeat_penalty = parse_float(name, value, 0.0f, 100.0f, 1);
    } else if (strcmp(long_name, "--seed") == 0) {
        o->seed = parse_seed(name, value);
        o->has_seed = 1;
    } else if (strcmp(long_name, "--steps") == 0) {
        o->steps = (int)parse_int(name, value, 0, INT_MAX);
        o->has_steps = 1;
    } else {
        return 0;
    }
    return 1;
}

/* What to run on: the mode, the prompt or text, chat's options; returns 0 for any other option. */
static int set_input_option(Options* o, const char* long_name, const char* name, const char* value) {
    if (strcmp(long_name, "--input") == 0) {
        o->prompt = value;
    } else if (strcmp(long_name, "--prompt-ids") == 0) {
        o->prompt_ids = value;
    } else if (strcmp(long_name, "--mode") == 0) {
        if (strcmp(value, "generate") && strcmp(value, "chat") && strcmp(value, "tokenize") &&
            strcmp(value, "bench") && strcmp(value, "eval"))
            die(2, "%s must be generate, chat, tokenize, bench or eval, got '%s'", name, value);
        o->mode = value;
    } else if (strcmp(long_name, "--system") == 0) {
        o->system_prompt = value;
    } else if (strcmp(long_name, "--thinking") == 0) {
        o->thinking = (int)parse_int(name, value, 0, 1);
    } else if (strcmp(long_name, "--show-thinking") == 0) {
        o->show_thinking = (int)parse_int(name, value, 0, 1);
    } else if (strcmp(long_name, "--file") == 0) {
        if (!value[0]) die(2, "--file needs a file name");
        o->file = value;
    } else {
        return 0;
    }
    return 1;
}

/* --threads N, or in bench mode a list of counts, of which the largest starts the kernels. */
static void set_threads(Options* o, const char* name, const char* value) {
    int counts[BENCH_MAX_THREAD_COUNTS];
    o->n_thread_counts = bench_parse_threads(value, counts, BENCH_MAX_THREAD_COUNTS);
    if (o->n_thread_counts < 1)
        die(2, "%s must be a number in 1..1024 (bench mode: or a list of up to %d, e.g. 1,2), got '%s'", name,
            BENCH_MAX_THREAD_COUNTS, value);
    o->threads = 0;
    for (int k = 0; k < o->n_thread_counts; k++)
        if (counts[k] > o->threads) o->threads = counts[k];
    o->thread_counts = value;
}

/* How the engine runs and what it writes beside the text; returns 0 for any other option. */
static int set_engine_option(Options* o, const char* long_name, const char* name, const char* value) {
    if (strcmp(long_name, "--ctx") == 0) {
        o->ctx = (int)parse_int(name, value, 0, INT_MAX);
    } else if (strcmp(long_name, "--threads") == 0) {
        set_threads(o, name, value);
    } else if (strcmp(long_name, "--kv-cache") == 0) {
        if (strcmp(value, "f32") && strcmp(value, "f16")) die(2, "%s must be f32 or f16, got '%s'", name, value);
        o->kv_f16 = strcmp(value, "f16") == 0;
    } else if (strcmp(long_name, "--norms-json") == 0) {
        if (!value[0]) die(2, "--norms-json needs a file name");
        o->norms_json = value;
    } else if (strcmp(long_name, "--dump-logits") == 0) {
        if (!value[0]) die(2, "--dump-logits needs a file name");
        o->dump_logits = value;
    } else {
        return 0;
    }
    return 1;
}

/* The RMSNorm lab's options (model.h NormLab); returns 0 for any other option. */
static int set_norm_lab_option(Options* o, const char* long_name, const char* name, const char* value) {
    if (strcmp(long_name, "--ablate") == 0) {
        parse_ablate(value, &o->norm_lab);
    } else if (strcmp(long_name, "--norm-eps") == 0) {
        o->norm_lab.eps = parse_float(name, value, 0.0f, 100.0f, 0);
        o->norm_lab.has_eps = 1;
    } else if (strcmp(long_name, "--norm") == 0) {
        if (strcmp(value, "rmsnorm") && strcmp(value, "layernorm"))
            die(2, "%s must be rmsnorm or layernorm, got '%s'", name, value);
        o->norm_lab.variant &= ~NORM_VARIANT_CENTER;
        if (strcmp(value, "layernorm") == 0) o->norm_lab.variant |= NORM_VARIANT_CENTER;
    } else {
        return 0;
    }
    return 1;
}

/* An option that takes a value: "-t 0.5", "--temperature 0.5" or "--temperature=0.5", at argv[i].
 * Returns how many of the following arguments it used (1 for a separate value, else 0). */
static int parse_valued(Options* o, int argc, char** argv, int i) {
    const char* arg = argv[i];
    char name[64];
    const char* value = NULL;
    const char* eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof name) die(2, "unknown option '%s' (see --help)", arg);
    memcpy(name, arg, len);
    name[len] = '\0';
    if (eq) value = eq + 1;
    else if (i + 1 < argc) value = argv[i + 1];
    const char* long_name = valued_long_name(name);
    if (long_name == NULL) {
        int unused;
        if (strcmp(name, "--show-norms") == 0) die(2, "--show-norms takes no value or =all, got '%s'", arg);
        if (switch_field(o, name, &unused) || strcmp(name, "--json") == 0)
            die(2, "option %s takes no value, got '%s'", name, arg);
        die(2, "unknown option '%s' (see --help)", arg);
    }
    if (value == NULL) die(2, "option %s needs a value (see --help)", name);
    note_given(o, long_name);
    if (!set_sampling_option(o, long_name, name, value) && !set_input_option(o, long_name, name, value) &&
        !set_engine_option(o, long_name, name, value) && !set_norm_lab_option(o, long_name, name, value)) {
        /* --bench-prompt, --bench-gen, --bench-reps, --bench-depth: checked here, used by bench.c */
        parse_int(name, value, 0, 1000000);
        add_bench_args(o, long_name, value);
    }
    return eq ? 0 : 1;
}

/* Options that contradict each other, or that only bench mode passes on. */
static void check_combinations(Options* o) {
    if (o->checkpoint == NULL) {
        usage(stderr);
        die(2, "no checkpoint given");
    }
    if (o->prompt && o->prompt_ids) die(2, "give either -i or --prompt-ids, not both");
    if (strcmp(o->mode, "bench") == 0 && o->thread_counts) { /* the kernels start the largest */
        add_bench_args(o, "--threads", o->thread_counts);
    } else if (o->n_thread_counts > 1) {
        die(2, "--threads takes a list of counts only in bench mode (-m bench), got '%s'", o->thread_counts);
    }
    /* --prompt-ids would leave chat and tokenize reading standard input instead, an error. */
    const int is_generate = strcmp(o->mode, "generate") == 0, is_eval = strcmp(o->mode, "eval") == 0;
    if (o->prompt_ids && !is_generate && !is_eval)
        die(2, "--prompt-ids is for generate mode and eval mode, not -m %s", o->mode);
    if (is_eval && ((o->prompt != NULL) + (o->prompt_ids != NULL) + (o->file != NULL)) > 1)
        die(2, "-m eval scores one text: give one of -i, --file and --prompt-ids");
}

/* Options of another mode do nothing in this one, which a note says rather than hiding it. */
static void note_other_mode_options(const Options* o) {
    const int is_generate = strcmp(o->mode, "generate") == 0, is_chat = strcmp(o->mode, "chat") == 0;
    const int is_bench = strcmp(o->mode, "bench") == 0, is_eval = strcmp(o->mode, "eval") == 0;
    static const char* const chat_only[] = {"--system",   "--no-think",      "--thinking", "--hide-think",
                                            "--show-thinking", "--keep-thinking", NULL};
    static const char* const generate_only[] = {"--show-norms", "--norms-json", NULL};
    static const char* const generate_and_chat[] = {"--temperature", "--top-p",     "--top-k",
                                                    "--min-p",       "--repeat-penalty", "--seed",
                                                    "--steps",       "--dump-logits", "--verbose-prompt", NULL};
    static const char* const not_bench[] = {"--input", NULL};
    static const char* const bench_only[] = {"--bench-prompt", "--bench-gen", "--bench-reps", "--bench-depth",
                                             NULL};
    static const char* const bench_and_eval[] = {"--json", NULL};
    static const char* const eval_only[] = {"--file", NULL};
    static const char* const norm_lab[] = {"--ablate", "--norm-eps", "--norm", NULL};
    if (!is_chat) warn_other_mode(o, chat_only, "-m chat");
    if (!is_generate) warn_other_mode(o, generate_only, "-m generate");
    if (!is_generate && !is_chat) warn_other_mode(o, generate_and_chat, "generate and chat");
    if (is_bench) warn_other_mode(o, not_bench, "generate, chat and tokenize");
    if (!is_bench) warn_other_mode(o, bench_only, "-m bench");
    if (!is_bench && !is_eval) warn_other_mode(o, bench_and_eval, "-m bench and -m eval");
    if (!is_eval) warn_other_mode(o, eval_only, "-m eval");
    if (!is_generate && !is_chat && !is_eval) warn_other_mode(o, norm_lab, "generate, chat and eval");
}

static void parse_args(int argc, char** argv, Options* o) {
    memset(o, 0, sizeof *o);
    o->mode = "generate";
    o->steps = 256;
    o->repeat_penalty = 1.0f;
    o->thinking = 1;
    o->show_thinking = 1;
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            check_stdout();
            exit(0);
        }
        if (arg[0] != '-' || arg[1] == '\0') { /* the checkpoint */
            if (o->checkpoint) die(2, "unexpected argument '%s' (the checkpoint is '%s')", arg, o->checkpoint);
            o->checkpoint = arg;
            continue;
        }
        if (!parse_switch(o, arg)) i += parse_valued(o, argc, argv, i);
    }
    check_combinations(o);
    note_other_mode_options(o);
}

/* "9707,11,1879" -> ids (malloc'ed). Every id must be a token of the model. */
static int* parse_prompt_ids(const char* s, int vocab_size, int* n_out) {
    int cap = 1;
    for (const char* c = s; *c; c++) cap += *c == ',';
    int* ids = malloc((size_t)cap * sizeof(int));
    if (ids == NULL) die(1, "out of memory");
    int n = 0;
    const char* c = s;
    for (;;) {
        char* end;
        errno = 0;
        while (*c == ' ') c++;
        long v = strtol(c, &end, 10);
        if (end == c || errno == ERANGE) die(2, "--prompt-ids: '%s' is not a comma-separated list of ids", s);
        if (v < 0 || v >= vocab_size)
            die(2, "--prompt-ids: id %ld is outside the vocabulary (0 .. %d)", v, vocab_size - 1);
        ids[n++] = (int)v;
        c = end;
        while (*c == ' ') c++;
        if (*c == '\0') break;
        if (*c != ',') die(2, "--prompt-ids: '%s' is not a comma-separated list of ids", s);
        c++;
    }
    *n_out = n;
    return ids;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void write_rows(FILE* f, const char* path, const float* rows, int n_rows, int vocab_size) {
    size_t count = (size_t)n_rows * (size_t)vocab_size;
    if (fwrite(rows, sizeof(float), count, f) != count) die(1, "%s: write failed", path);
}

static int is_eos(const FileHeader* h, int id) {
    for (uint32_t i = 0; i < h->n_eos; i++)
        if (h->eos_ids[i] == id) return 1;
    return 0;
}

/* Prints one generated token: as text through the tokenizer, or as a number when the checkpoint
 * has no tokenizer. */
static void emit(const Tokenizer* tok, Utf8Stream* stream, int id, int* n_emitted) {
    if (tok) tokenizer_print(tok, stream, id, 0, stdout);
    else printf("%s%d", *n_emitted ? " " : "", id);
    (*n_emitted)++;
    fflush(stdout);
}

/* --show-norms and --norms-json (norm_trace.h): the buffers the trace writes through, allocated
 * before the token loop so that it allocates nothing. */
typedef struct {
    char* table_buf; /* the table's stdio buffer */
    char* json_buf;  /* the JSON file's */
} TraceBuffers;

#define TRACE_STDIO_BUFFER (1 << 16)

/* --show-norms traces the prompt's last token, the one whose logits pick the first generated token;
 * --show-norms=all and --norms-json every position that goes through forward(), the prompt's and
 * each generated token fed back. The table goes to a temporary file and is printed to stderr after
 * the text, into which it would otherwise cut. */
static void trace_open(NormTrace* tr, TraceBuffers* b, const Options* o, const Config* c, int n_prompt) {
    memset(tr, 0, sizeof *tr);
    memset(b, 0, sizeof *b);
    tr->pos = o->show_norms == 1 ? n_prompt - 1 : -1;
    tr->each_head = o->show_norms == 2;
    tr->scratch = malloc((size_t)(c->dim > c->head_dim ? c->dim : c->head_dim) * sizeof(float));
    if (tr->scratch == NULL) die(1, "out of memory");
    if (o->show_norms) {
        tr->table = tmpfile();
        if (tr->table == NULL) die(1, "--show-norms: cannot create a temporary file: %s", strerror(errno));
        b->table_buf = malloc(TRACE_STDIO_BUFFER);
        if (b->table_buf == NULL || setvbuf(tr->table, b->table_buf, _IOFBF, TRACE_STDIO_BUFFER) != 0)
            die(1, "out of memory");
    }
    if (o->norms_json) {
        tr->json = fopen(o->norms_json, "w");
        if (tr->json == NULL) die(1, "%s: cannot open for writing: %s", o->norms_json, strerror(errno));
        b->json_buf = malloc(TRACE_STDIO_BUFFER);
        if (b->json_buf == NULL || setvbuf(tr->json, b->json_buf, _IOFBF, TRACE_STDIO_BUFFER) != 0)
            die(1, "out of memory");
    }
}

/* The table to stderr; the JSON file closed (removed if it could not be written whole). */
static void trace_close(NormTrace* tr, TraceBuffers* b, const Options* o) {
    if (tr->table) {
        fflush(stdout); /* the text's last line before the table, where both go to one place */
        char chunk[4096];
        size_t got;
        if (fflush(tr->table) != 0 || fseek(tr->table, 0, SEEK_SET) != 0)
            die(1, "--show-norms: the temporary file could not be written");
        while ((got = fread(chunk, 1, sizeof chunk, tr->table)) > 0) fwrite(chunk, 1, got, stderr);
        fclose(tr->table);
    }
    if (tr->json && (ferror(tr->json) | fclose(tr->json)) != 0) {
        remove(o->norms_json);
        die(1, "%s: write failed", o->norms_json);
    }
    free(b->table_buf);
    free(b->json_buf);
    free(tr->scratch);
}

/* The prompt: ids given as such, or encoded text (plus BOS when the model has one; Qwen3 has none,
 * QWEN3.md 2.3), or BOS alone when neither is given (malloc'ed; NULL when it is empty). */
static int* read_prompt(const Transformer* t, const Tokenizer* tok, const Options* o, int* n_prompt) {
    const int V = t->config.vocab_size;
    int* prompt = NULL;
    *n_prompt = 0;
    if (o->prompt_ids) {
        prompt = parse_prompt_ids(o->prompt_ids, V, n_prompt);
    } else if (o->prompt) {
        if (tok == NULL) die(1, "%s has no tokenizer: give the prompt with --prompt-ids", o->checkpoint);
        int n_text = 0;
        int* text = tokenizer_encode(tok, o->prompt, strlen(o->prompt), &n_text);
        if (text == NULL) die(1, "out of memory");
        int bos = t->header.bos_id >= 0;
        prompt = malloc((size_t)(n_text + bos + 1) * sizeof(int));
        if (prompt == NULL) die(1, "out of memory");
        if (bos) prompt[0] = t->header.bos_id;
        memcpy(prompt + bos, text, (size_t)n_text * sizeof(int));
        *n_prompt = n_text + bos;
        free(text);
        for (int i = 0; i < *n_prompt; i++)
            if (prompt[i] < 0 || prompt[i] >= V)
                die(1, "the tokenizer gave id %d, outside the model's vocabulary of %d", prompt[i], V);
    } else if (t->header.bos_id >= 0) {
        prompt = malloc(sizeof(int));
        if (prompt == NULL) die(1, "out of memory");
        prompt[0] = t->header.bos_id;
        *n_prompt = 1;
    }
    return prompt;
}

/* A prompt that is empty or longer than the context ends the run; --verbose-prompt shows its ids. */
static void check_prompt(const Config* c, const Options* o, const int* prompt, int n_prompt) {
    if (n_prompt == 0 && o->prompt) die(2, "the prompt (-i) is empty and the model has no BOS token to start from");
    if (n_prompt == 0) die(2, "no prompt: give -i TEXT or --prompt-ids IDS");
    if (n_prompt > c->max_seq_len)
        die(1, "the prompt has %d tokens, more than the model's context of %d positions", n_prompt,
            c->max_seq_len);
    if (n_prompt > c->seq_len)
        die(1, "the prompt has %d tokens, more than the context of %d (raise it with -c, at most %d)",
            n_prompt, c->seq_len, c->max_seq_len);
    if (o->verbose_prompt) {
        char label[48];
        snprintf(label, sizeof label, "run: prompt of %d token%s:", n_prompt, n_prompt == 1 ? "" : "s");
        print_token_ids(stderr, label, prompt, n_prompt);
    }
}

/* --dump-logits: the file, and a buffer for a prefill chunk's rows (NULL without the option). */
typedef struct {
    FILE* file;
    float* chunk_logits;
    const char* path;
} LogitsDump;

static LogitsDump open_dump(const Transformer* t, const Options* o) {
    LogitsDump d = {NULL, NULL, o->dump_logits};
    if (o->dump_logits) {
        d.file = fopen(o->dump_logits, "wb");
        if (d.file == NULL) die(1, "%s: cannot open for writing: %s", o->dump_logits, strerror(errno));
        d.chunk_logits = malloc((size_t)t->state.max_batch * (size_t)t->config.vocab_size * sizeof(float));
        if (d.chunk_logits == NULL) die(1, "out of memory");
    }
    return d;
}

/* Prefill: the whole prompt as matrices (QWEN3.md 2.3). With --dump-logits, in chunks of max_batch
 * rows so that every row's logits fit in one buffer. Returns the last position's logits. */
static float* prefill(Transformer* t, const int* prompt, int n_prompt, const LogitsDump* dump) {
    float* logits = NULL;
    if (dump->file) {
        for (int i = 0; i < n_prompt; i += t->state.max_batch) {
            int nb = n_prompt - i < t->state.max_batch ? n_prompt - i : t->state.max_batch;
            logits = forward(t, prompt + i, nb, i, dump->chunk_logits);
            if (logits == NULL) die(1, "forward pass failed");
            write_rows(dump->file, dump->path, dump->chunk_logits, nb, t->config.vocab_size);
        }
    } else {
        logits = forward(t, prompt, n_prompt, 0, NULL);
        if (logits == NULL) die(1, "forward pass failed");
    }
    return logits;
}

/* What the token loop did: tokens generated, run through the model and printed, and whether it
 * stopped at the end of the context. */
typedef struct {
    int n_generated, n_decoded, n_emitted, context_full;
} DecodeCounts;

/* Decode: sample, print, feed the token back, until an end-of-sequence id, -n tokens or the end of
 * the context. history holds the prompt's n_prompt tokens and room for every generated one. */
static DecodeCounts decode(Transformer* t, const Tokenizer* tok, Sampler* sampler, const Options* o,
                           float* logits, int* history, int n_prompt, const LogitsDump* dump, Utf8Stream* stream) {
    const Config* c = &t->config;
    DecodeCounts n = {0, 0, 0, 0};
    int pos = n_prompt, n_history = n_prompt;
    while (n.n_generated < o->steps) {
        int next = sampler_sample(sampler, logits, history, n_history);
        if (is_eos(&t->header, next)) break;
        emit(tok, stream, next, &n.n_emitted);
        if (ferror(stdout)) break; /* nobody reads what follows; check_stdout reports it */
        history[n_history++] = next;
        n.n_generated++;
        /* The last token is only run through the model when its logits are wanted. */
        if (n.n_generated == o->steps && dump->file == NULL) break;
        if (pos >= c->seq_len) {
            n.context_full = 1;
            break;
        }
        logits = forward(t, &next, 1, pos, NULL);
        if (logits == NULL) die(1, "forward pass failed");
        pos++;
        n.n_decoded++;
        if (dump->file) write_rows(dump->file, dump->path, logits, 1, c->vocab_size);
    }
    return n;
}

/* The speed line, and the seed when it came from the clock so that a run can be repeated. */
static void report_speed(const Options* o, const Sampler* sampler, uint64_t seed, int n_prompt,
                         const DecodeCounts* n, double prefill_s, double decode_s) {
    fprintf(stderr, "prompt tokens: %d, prefill: %.1f tok/s, generated tokens: %d, decode: ",
            n_prompt, n_prompt / (prefill_s > 0 ? prefill_s : 1e-9), n->n_generated);
    if (n->n_decoded > 0) fprintf(stderr, "%.1f tok/s\n", n->n_decoded / (decode_s > 0 ? decode_s : 1e-9));
    else fprintf(stderr, "- tok/s\n");
    if (!o->has_seed && sampler->temperature > 0 && n->n_generated > 0)
        fprintf(stderr, "seed: %llu (from the clock; -s %llu repeats this run)\n", (unsigned long long)seed,
                (unsigned long long)seed);
}

/* seed: the sampler's, reported when it came from the clock so that a run can be repeated. */
static int generate(Transformer* t, const Tokenizer* tok, Sampler* sampler, const Options* o, uint64_t seed) {
    const Config* c = &t->config;
    int n_prompt = 0;
    int* prompt = read_prompt(t, tok, o, &n_prompt);
    check_prompt(c, o, prompt, n_prompt);

    /* Everything the token loop needs is allocated here, before it. */
    /* The tokens seen, for the repetition penalty: at most the context plus one last token. */
    int* history = malloc(((size_t)c->seq_len + 2) * sizeof(int));
    if (history == NULL) die(1, "out of memory");
    memcpy(history, prompt, (size_t)n_prompt * sizeof(int));
    LogitsDump dump = open_dump(t, o);
    NormTrace trace = {0};
    TraceBuffers trace_buffers = {0};
    if (o->show_norms || o->norms_json) {
        trace_open(&trace, &trace_buffers, o, c, n_prompt);
        t->norm_trace = &trace;
    }

    if (o->prompt && tok) { /* show the prompt, then the continuation, as llama2.c does */
        fputs(o->prompt, stdout);
        fflush(stdout);
    }
    double t0 = now_seconds();
    float* logits = prefill(t, prompt, n_prompt, &dump);
    double t1 = now_seconds();
    if (trace.pos >= 0 && trace.json == NULL)
        t->norm_trace = NULL; /* the prompt's last token has been through every call site */
    Utf8Stream stream = {{0}, 0};
    DecodeCounts n = decode(t, tok, sampler, o, logits, history, n_prompt, &dump, &stream);
    double t2 = now_seconds();
    t->norm_trace = NULL;
    if (tok) utf8_stream_flush(&stream, stdout);
    if (n.n_emitted > 0 || (o->prompt && tok)) fputc('\n', stdout);
    check_stdout();

    if (o->show_norms || o->norms_json) trace_close(&trace, &trace_buffers, o);
    if (n.context_full) {
        char advice[80];
        fprintf(stderr, "run: the context is full (%d token%s): generation stopped; %s\n", c->seq_len,
                c->seq_len == 1 ? "" : "s", context_advice(c, advice, sizeof advice));
    }
    if (dump.file && fclose(dump.file) != 0) die(1, "%s: write failed", o->dump_logits);
    report_speed(o, sampler, seed, n_prompt, &n, t1 - t0, t2 - t1);
    free(dump.chunk_logits);
    free(history);
    free(prompt);
    return 0;
}

static int tokenize(const Tokenizer* tok, const Options* o) {
    if (tok == NULL) die(1, "%s has no tokenizer: tokenize needs one (export with tokenizer.json)", o->checkpoint);
    size_t len;
    char* text;
    if (o->prompt) {
        len = strlen(o->prompt);
        text = malloc(len + 1);
        if (text == NULL) die(1, "out of memory");
        memcpy(text, o->prompt, len + 1);
    } else {
        if (isatty(STDIN_FILENO))
            fputs("run: reading the text to tokenize from standard input: type it, then Ctrl-D on a new line "
                  "(or pass -i TEXT)\n", stderr);
        text = read_all(STDIN_FILENO, "standard input", &len);
        if (text == NULL) exit(1);
    }
    int n = 0;
    int* ids = tokenizer_encode(tok, text, len, &n);
    if (ids == NULL) die(1, "out of memory");
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    check_stdout();
    free(ids);
    free(text);
    return 0;
}

/* The seed when -s is not given: the wall clock in nanoseconds and the process id, mixed (SplitMix64's
 * finaliser) so that runs started in the same second, or side by side, sample differently. */
static uint64_t seed_from_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() << 40;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* More threads than the CPUs this process may run on only take turns on them (a 2-CPU machine ran
 * 9x slower with 1000), so --threads is held to that number, with a note; a bench list's larger
 * counts are then run with it too (kernels_set_threads never exceeds the pool's size). */
static void clamp_threads(Options* o) {
    cpu_set_t set;
    if (o->threads <= 0 || sched_getaffinity(0, sizeof set, &set) != 0) return;
    const int cpus = CPU_COUNT(&set);
    if (cpus < 1 || o->threads <= cpus) return;
    if (o->n_thread_counts > 1)
        fprintf(stderr, "run: note: --threads %s: counts above the %d CPU%s this process may run on are run with %d\n",
                o->thread_counts, cpus, cpus == 1 ? "" : "s", cpus);
    else
        fprintf(stderr, "run: note: --threads %d is more than the %d CPU%s this process may run on; using %d\n",
                o->threads, cpus, cpus == 1 ? "" : "s", cpus);
    o->threads = cpus;
}

/* The RMSNorm lab's switches (model.h NormLab) set on the model, with a note where they change
 * nothing or --show-norms does not show them. */
static void apply_norm_lab(Transformer* t, const Options* o) {
    t->norm_lab = o->norm_lab;
    if ((o->norm_lab.skip & NORM_SKIP_QK) && !(t->config.flags & FLAG_QK_NORM))
        fprintf(stderr, "run: note: --ablate qk-norm changes nothing: this model has no QK-Norm\n");
    if (o->show_norms && (o->norm_lab.skip || o->norm_lab.variant || o->norm_lab.has_eps))
        fprintf(stderr, "run: note: --show-norms shows each RMSNorm as trained, not as --ablate, --norm-eps "
                        "and --norm change it\n");
}

static int run_eval(Transformer* t, const Tokenizer* text_tok, const Options* o) {
    int n_ids = 0;
    int* ids = o->prompt_ids ? parse_prompt_ids(o->prompt_ids, t->config.vocab_size, &n_ids) : NULL;
    EvalOptions eval = {o->prompt, o->file, ids, n_ids, o->json};
    int status = eval_main(t, text_tok, &eval);
    free(ids);
    return status;
}

/* Generate and chat: the sampler, then the mode. */
static int run_sampling_mode(Transformer* t, const Tokenizer* text_tok, const Options* o) {
    /* Sampling defaults: the model's generation_config (0 in the header means absent), else
     * llama2.c's 1.0 / 0.9, and no top-k. A no-think chat follows Qwen's advice for that mode
     * instead (QWEN3.md 1.2: temperature 0.7, top-p 0.8, top-k 20); the thinking mode's advice
     * (0.6, 0.95, 20) is what Qwen3's generation_config holds. */
    const FileHeader* h = &t->header;
    float def_temperature = h->temperature > 0 ? h->temperature : 1.0f;
    float def_top_p = h->top_p > 0 ? h->top_p : 0.9f;
    int def_top_k = h->top_k;
    if (strcmp(o->mode, "chat") == 0 && !o->thinking) {
        def_temperature = 0.7f;
        def_top_p = 0.8f;
        def_top_k = 20;
    }
    float temperature = o->has_temperature ? o->temperature : def_temperature;
    float top_p = o->has_top_p ? o->top_p : def_top_p;
    int top_k = o->has_top_k ? o->top_k : def_top_k;
    uint64_t seed = o->has_seed ? o->seed : seed_from_clock();
    Sampler sampler;
    if (sampler_init(&sampler, t->config.vocab_size, temperature, top_p, top_k, o->min_p, o->repeat_penalty,
                     seed) != 0)
        die(1, "out of memory");
    int status;
    if (strcmp(o->mode, "chat") == 0) {
        ChatOptions chat = {o->system_prompt, o->prompt, o->has_steps ? o->steps : 0, o->thinking,
                            o->show_thinking, o->keep_thinking, o->verbose_prompt, o->dump_logits,
                            seed, !o->has_seed};
        if (text_tok == NULL) die(1, "%s has no tokenizer: chat needs one (export with tokenizer.json)", o->checkpoint);
        status = chat_main(t, text_tok, &sampler, &chat);
    } else {
        status = generate(t, text_tok, &sampler, o, seed);
    }
    sampler_free(&sampler);
    return status;
}

int main(int argc, char** argv) {
    if (quantize_requested(argc, argv)) return quantize_main(argc, argv); /* its own options: quantize.h */
    Options o;
    parse_args(argc, argv, &o);
    clamp_threads(&o);
    const TransformerOptions topt = {.threads = o.threads, .ctx = o.ctx, .no_mmap = o.no_mmap,
                                     .refill_page_cache = o.refill_page_cache, .kv_f16 = o.kv_f16,
                                     .bf16_activations = o.bf16_activations};
    Transformer t;
    char err[512];
    if (transformer_load(&t, o.checkpoint, &topt, err, sizeof err) != 0) die(1, "%s", err);
    if (o.ctx > t.config.max_seq_len)
        fprintf(stderr, "run: note: -c %d is more than the model's maximum context of %d; using %d\n", o.ctx,
                t.config.max_seq_len, t.config.max_seq_len);
    if (o.refill_page_cache && o.no_mmap)
        fprintf(stderr, "run: note: --refill-page-cache ignored: --no-mmap reads the file without mapping it\n");
    if (o.bf16_activations && !kernels_bf16_activations(t.kernels))
        fprintf(stderr, "run: note: --bf16-activations ignored: this build has no bf16 dot product (AVX-512 BF16)\n");

    Tokenizer* tok = tokenizer_new(t.tokenizer_data, t.tokenizer_bytes, err, sizeof err);
    if (tok == NULL) {
        transformer_free(&t);
        die(1, "%s: tokenizer: %s", o.checkpoint, err);
    }
    const Tokenizer* text_tok = tokenizer_size(tok) > 0 ? tok : NULL; /* NULL: ids only */

    /* The RMSNorm lab's switches change the forward pass of the modes that run the model on text. */
    const int is_eval = strcmp(o.mode, "eval") == 0;
    if (is_eval || strcmp(o.mode, "generate") == 0 || strcmp(o.mode, "chat") == 0) apply_norm_lab(&t, &o);

    int status;
    if (strcmp(o.mode, "tokenize") == 0) status = tokenize(text_tok, &o);
    else if (is_eval) status = run_eval(&t, text_tok, &o);
    else if (strcmp(o.mode, "bench") == 0) status = bench_main(&t, o.n_bench_args, (char**)o.bench_args);
    else status = run_sampling_mode(&t, text_tok, &o);
    tokenizer_free(tok);
    transformer_free(&t);
    if (status == 0) check_stdout(); /* the bench's table, the chat's answers */
    return status;
}
