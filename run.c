/* run.c: the command line of the engine (llama2.c's flags, plus a few): the options, generate and
 * tokenize; chat, bench, eval and quantize are in cli/.
 *
 *   ./run MODEL.bin [options]          (./run --help lists them)
 *
 * The test contract that other tools depend on:
 *   --prompt-ids 9707,11,1879   the prompt as token ids (exactly these, no BOS added)
 *   --dump-logits PATH          raw little-endian float32 logits, vocab_size per row: one row for
 *                               every prompt position, then one for every generated token
 *   -n 0                        process the prompt, generate nothing
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/available_memory.h"
#include "cli/bench.h"
#include "cli/chat.h"
#include "cli/eval.h"
#include "cli/norm_lab.h"
#include "cli/norm_trace.h"
#include "cli/output_path.h"
#include "cli/quantize.h"
#include "cli/read_text.h"
#include "cli/sampler.h"
#include "model.h"
#include "tokenizer/tokenizer.h"

/* The modes as bits, so that an option can name the modes it does something in. */
enum { GENERATE = 1, CHAT = 2, TOKENIZE = 4, BENCH = 8, EVAL = 16, ANY_MODE = 31 };
static const char* const MODE_NAMES[] = {"generate", "chat", "tokenize", "bench", "eval"};

/* Every option, in --help's order. In any other mode than its own an option does nothing, and a
 * note says so. A row with only help is a heading of --help. */
typedef struct {
    const char* short_name; /* NULL: none */
    const char* long_name;
    const char* arg;        /* the value's name in --help; NULL: a switch, which takes no value */
    int modes;
    const char* help;       /* continued lines ('\n') are indented under the first */
} OptionSpec;

static const OptionSpec OPTIONS[] = {
    {"-t", "--temperature", "T", GENERATE | CHAT,
     "sampling temperature, [0,100]; 0 = greedy (default: the model's, else 1;\na --no-think chat: 0.7)"},
    {"-p", "--top-p", "P", GENERATE | CHAT,
     "top-p (nucleus) sampling, [0,1]; 0 or 1 = off (default: the model's, else\n0.9; a --no-think chat: 0.8)"},
    {"-k", "--top-k", "K", GENERATE | CHAT,
     "keep the K most likely tokens; 0 = off (default: the model's;\na --no-think chat: 20)"},
    {NULL, "--min-p", "P", GENERATE | CHAT, "drop tokens below P * the top probability, [0,1]; 0 = off (default)"},
    {NULL, "--repeat-penalty", "R", GENERATE | CHAT,
     "repetition penalty over every token seen, (0,100]; 1 = off (default)"},
    {"-s", "--seed", "S", GENERATE | CHAT, "random seed >= 0 (default: from the clock, printed at the end)"},
    {"-n", "--steps", "N", GENERATE | CHAT,
     "tokens to generate; 0 = only run the prompt (default 256; chat: per\nanswer, 0 or by default until the context is full)"},
    {"-i", "--input", "TEXT", GENERATE | CHAT | TOKENIZE | EVAL,
     "the prompt (tokenize and eval mode: the text; default: standard input)"},
    {NULL, "--prompt-ids", "IDS", GENERATE | EVAL | TOKENIZE,
     "the prompt as token ids, e.g. 9707,11,1879 (eval: the tokens to score;\ntokenize: the ids to write as text)"},
    {"-m", "--mode", "MODE", ANY_MODE,
     "generate | chat | tokenize | bench | eval (default generate); chat reads\n"
     "one message per line (/help lists its commands); eval scores a text in\n"
     "windows of -c tokens: loss (nats/token), perplexity, top-1"},
    {"-y", "--system", "TEXT", CHAT, "chat mode: the system prompt"},
    {NULL, "--no-think", NULL, CHAT, "chat mode: thinking off, the template's empty think block (--thinking 0)"},
    {NULL, "--hide-think", NULL, CHAT, "chat mode: do not print the thinking (--show-thinking 0)"},
    {NULL, "--thinking", "0|1", CHAT, "chat mode: 1 = Qwen3's thinking mode (default), 0 = no-think"},
    {NULL, "--show-thinking", "0|1", CHAT, "chat mode: print the thinking (1, default) or hide it"},
    {NULL, "--keep-thinking", NULL, CHAT,
     "chat mode: keep earlier answers' thinking in the KV cache and run only each\n"
     "turn's new text (default: the template's prompt, which drops it)"},
    {NULL, "--verbose-prompt", NULL, GENERATE | CHAT,
     "print the prompt's token ids to stderr (chat: each turn's and answer's)"},
    {"-c", "--ctx", "N", ANY_MODE, "context length (KV cache positions); 0 = min(4096, the model's);\nbench mode: at least what its tests take"},
    {NULL, "--threads", "N", ANY_MODE,
     "worker threads (default and most: the CPUs this process may run on);\n"
     "bench mode: a list, e.g. 1,2, the counts taking turns"},
    {NULL, "--kv-cache", "f32|f16|q8", ANY_MODE,
     "the KV cache's element type (default f32); f16 halves its memory and\n"
     "reads (keys and values rounded to 11 significant bits), q8 takes 9/32 of\n"
     "f32's (int8 in groups of 16 with a half scale each); over either, prefill\n"
     "attends with bf16 products where the CPU has AVX-512 BF16, and over q8\n"
     "decode multiplies int8 keys by an int8 query (AVX-512 VNNI, or AVX2)"},
    {NULL, "--bf16-activations", NULL, ANY_MODE,
     "bf16 prefill with the CPU's bf16 dot product (AVX-512 BF16), llama.cpp's\n"
     "precision; ignored with a note where the build has none"},
    {NULL, "--dump-logits", "PATH", GENERATE | CHAT,
     "write every prompt position's and generated token's logits as raw\nlittle-endian float32 (vocab_size per row)"},
    {NULL, "--show-norms", NULL, GENERATE,
     "print to stderr what each RMSNorm call site does at the prompt's last\n"
     "token (rms in, scale, rms(w), rms out); =all: every position and head"},
    {NULL, "--norms-json", "PATH", GENERATE,
     "every RMSNorm call site at every position and head, and each head's\n"
     "largest |q.k|/sqrt(d), as JSON lines (tools/plot_norms.py draws them)"},
    {"-f", "--file", "PATH", GENERATE | EVAL | TOKENIZE,
     "the text from a file, - for standard input: generate's prompt (not echoed),\n"
     "eval's text to score, tokenize's text (eval's and tokenize's default: -i, else\n"
     "standard input)"},
    {NULL, "--json", NULL, BENCH | EVAL, "bench and eval mode: JSON lines"},
    {NULL, "--bench-prompt", "N", BENCH, "bench mode: prefill tokens (default 512, or what fits the context)"},
    {NULL, "--bench-gen", "N", BENCH, "bench mode: decode tokens (default 128, or what fits the context)"},
    {NULL, "--bench-reps", "N", BENCH, "bench mode: timed repetitions of each test (default 5)"},
    {NULL, "--bench-depth", "N", BENCH, "bench mode: positions in the KV cache before each test (default 0)"},
    {"-h", "--help", NULL, ANY_MODE, "this help"},
    {NULL, NULL, NULL, 0, "RMSNorm lab (generate, chat and eval; each changes the model, for teaching):"},
    {NULL, "--ablate", "LIST", GENERATE | CHAT | EVAL,
     "leave out RMSNorm uses: qk-norm, final-norm, pre-norms (pre-attention\n"
     "and pre-MLP), or change a part: norm-weight (w = 1), norm-scale (no 1/rms),\n"
     "norm-gain (w = its mean); comma-separated. NAME@LAYERS limits one to\n"
     "layers (@0, @1,2, @0-3; final: the final norm): qk-norm@1,2,norm-weight@final"},
    {NULL, "--norm-eps", "X", GENERATE | CHAT | EVAL, "eps inside every RMSNorm's square root instead of the model's"},
    {NULL, "--norm", "rmsnorm|layernorm", GENERATE | CHAT | EVAL,
     "layernorm: subtract the vector's mean first (LayerNorm without a bias);\n"
     "rmsnorm (default): the model as trained"},
};
#define N_OPTIONS (int)(sizeof OPTIONS / sizeof OPTIONS[0])

static void usage(FILE* out) {
    fputs("Usage:   ./run MODEL.bin [options]\n"
          "Example: ./run model.bin -n 256 -i \"Once upon a time\"\nOptions:\n", out);
    for (int k = 0; k < N_OPTIONS; k++) {
        const OptionSpec* s = &OPTIONS[k];
        if (s->long_name == NULL) {
            fprintf(out, "%s\n", s->help);
            continue;
        }
        char names[64];
        snprintf(names, sizeof names, "  %-2s%s%s%s%s", s->short_name ? s->short_name : "", s->short_name ? ", " : "  ",
                 s->long_name, s->arg ? " " : "", s->arg ? s->arg : "");
        if (strlen(names) > 26) fprintf(out, "%s\n%27s", names, ""); /* the help on the next line */
        else fprintf(out, "%-26s ", names);
        for (const char* h = s->help; *h; h++) {
            fputc(*h, out);
            if (*h == '\n') fprintf(out, "%27s", "");
        }
        fputc('\n', out);
    }
    fputs("Quantize mode (-m quantize): ./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin writes an\n"
          "  f32 or bf16 checkpoint as q8 or q4 (./run -m quantize --help)\n"
          "Environment (the KERNELS_ ones only in the fast build, not in the reference one, make ref):\n"
          "  KERNELS_SPIN_US (idle threads' spin before sleeping, default 200),\n"
          "  KERNELS_PREFETCH (near|mid: a fixed x86 decode weight prefetch; default: mid, or for weights\n"
          "  of 64 MB or more the distance timed on them at load),\n"
          "  KERNELS_AMX=0 (prefill on the AVX-512 kernels instead of AMX tiles, where the CPU has AMX),\n"
          "  KERNELS_FLOAT_PANELS=0|1 (f32/bf16 prefill from packed panels; by default off on Zen 4 only),\n"
          "  BENCH_LLC_BYTES (the last-level cache size the bench compares decode's bytes per token\n"
          "  with, default from /sys; 0 = always give decode's % of roof),\n"
          "  NO_COLOR, TERM=dumb (chat: the thinking printed plain, not dim)\n", out);
}

typedef struct {
    const char* checkpoint;
    int mode;                  /* GENERATE, CHAT, TOKENIZE, BENCH or EVAL */
    const char* mode_name;
    const char* prompt;        /* -i */
    const char* prompt_ids;    /* --prompt-ids */
    float temperature, top_p, min_p, repeat_penalty;
    int top_k, steps, threads, ctx;
    uint64_t seed;
    int thinking, show_thinking; /* chat mode */
    KVType kv_type;
    int show_norms;            /* 1: --show-norms, 2: --show-norms=all */
    NormLab norm_lab;          /* --ablate, --norm-eps, --norm (cli/norm_lab.h) */
    BenchOptions bench;        /* --bench-*, --json, --threads' counts (a list only in bench mode) */
    const char* given[N_OPTIONS]; /* each option's last value ("" for a switch); NULL: not given */
    int order[N_OPTIONS], n_given; /* the options given, in the order they first came */
} Options;

/* One-line error and exit (status 2: bad command line; 1: anything else). */
static __attribute__((noreturn, format(printf, 2, 3))) void die(int status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(status);
}

/* Output that could not be written (a full disk, a pipe closed while SIGPIPE is ignored) ends the
 * run with an error instead of a silent success, with the reason of the write that failed
 * (stdout_errno: where generation saw it fail and stopped, as a later flush may not try again). */
static int stdout_errno;
static void check_stdout(void) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        const int err = errno ? errno : stdout_errno;
        die(1, "standard output: write failed%s%s", err ? ": " : "", err ? strerror(err) : "");
    }
}

static int streq(const char* a, const char* b) { return strcmp(a, b) == 0; }

/* A number as the options take it: decimal, a '-' at most before it; no '+', space, hex, inf or nan,
 * which strtof and strtoll would take, so that every numeric option reads what --seed reads. */
static int plain_number(const char* s) {
    const char* p = s + (*s == '-');
    return (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1]))) && !strpbrk(s, "xX");
}

/* A number in [lo, hi], or in (lo, hi] when lo_open; anything else ends the run with a message that
 * states that range. A value too large for a float ("1e39") is out of the range, not "not a number". */
static float parse_float(const char* flag, const char* s, float lo, float hi, int lo_open) {
    char* end;
    errno = 0;
    float v = strtof(s, &end);
    if (!plain_number(s) || end == s || *end != '\0') die(2, "%s needs a number, got '%s'", flag, s);
    /* ERANGE with a finite result is an underflow: a value as close to 0 as a float gets */
    if ((errno == ERANGE && isinf(v)) || v < lo || v > hi || (lo_open && v == lo))
        die(2, "%s must be in %c%g, %g], got %s", flag, lo_open ? '(' : '[', lo, hi, s);
    return v;
}

static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!plain_number(s) || end == s || *end != '\0') die(2, "%s needs an integer, got '%s'", flag, s);
    if (errno == ERANGE || v < lo || v > hi) die(2, "%s must be in [%lld, %lld], got %s", flag, lo, hi, s);
    return v;
}

static uint64_t parse_seed(const char* flag, const char* s) {
    char* end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!(*s >= '0' && *s <= '9') || end == s || *end != '\0' || errno == ERANGE)
        die(2, "%s needs a non-negative integer, got '%s'", flag, s);
    return (uint64_t)v;
}

/* 0 for value a, 1 for value b; anything else ends the run. */
static int parse_choice(const char* flag, const char* value, const char* a, const char* b) {
    if (!streq(value, a) && !streq(value, b)) die(2, "%s must be %s or %s, got '%s'", flag, a, b, value);
    return streq(value, b);
}

static KVType parse_kv_type(const char* flag, const char* value) {
    if (!streq(value, "f32") && !streq(value, "f16") && !streq(value, "q8"))
        die(2, "%s must be f32, f16 or q8, got '%s'", flag, value);
    return streq(value, "q8") ? KV_Q8 : streq(value, "f16") ? KV_F16 : KV_F32;
}

/* "9707,11,1879" -> ids (malloc'ed). Every id must be a token of the model. */
static int* parse_prompt_ids(const char* s, int vocab_size, int* n_out) {
    int cap = 1;
    for (const char* c = s; *c; c++) cap += *c == ',';
    int* ids = malloc((size_t)cap * sizeof(int));
    if (ids == NULL) die(1, "out of memory");
    int n = 0;
    for (const char* c = s;; c++) {
        char* end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (end == c || errno == ERANGE) die(2, "--prompt-ids: '%s' is not a comma-separated list of ids", s);
        if (v < 0 || v >= vocab_size)
            die(2, "--prompt-ids: id %ld is outside the vocabulary (0 .. %d)", v, vocab_size - 1);
        ids[n++] = (int)v;
        for (c = end; *c == ' ';) c++;
        if (*c == '\0') break;
        if (*c != ',') die(2, "--prompt-ids: '%s' is not a comma-separated list of ids", s);
    }
    *n_out = n;
    return ids;
}

static void set_mode(Options* o, const char* name, const char* value) {
    int k = 0;
    while (k < 5 && !streq(value, MODE_NAMES[k])) k++;
    if (k == 5) die(2, "%s must be generate, chat, tokenize, bench or eval, got '%s'", name, value);
    o->mode = 1 << k;
    o->mode_name = MODE_NAMES[k];
}

/* --threads N, or in bench mode a list of counts "1,2,4", of which the largest starts the kernels. */
static void set_threads(Options* o, const char* name, const char* value) {
    BenchOptions* b = &o->bench;
    b->n_threads = 0;
    o->threads = 0;
    for (const char* p = value;; p++) {
        char* end = (char*)p;
        const long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : 0; /* no sign, no space */
        if (v < 1 || v > 1024 || b->n_threads == BENCH_MAX_THREAD_COUNTS || (*end != '\0' && *end != ','))
            die(2, "%s must be a number in 1..1024 (bench mode: or a list of up to %d, e.g. 1,2), got '%s'", name,
                BENCH_MAX_THREAD_COUNTS, value);
        b->threads[b->n_threads++] = (int)v;
        if (v > o->threads) o->threads = (int)v;
        if (*end == '\0') return;
        p = end;
    }
}

/* The option opt (its long name; name is as given, for the messages) set from value. The switches
 * not named here are read with given(). */
static void set_option(Options* o, const char* opt, const char* name, const char* value) {
    if (streq(opt, "--help")) {
        usage(stdout);
        check_stdout();
        exit(0);
    }
    if (streq(opt, "--temperature")) o->temperature = parse_float(name, value, 0.0f, 100.0f, 0);
    else if (streq(opt, "--top-p")) o->top_p = parse_float(name, value, 0.0f, 1.0f, 0);
    else if (streq(opt, "--top-k")) o->top_k = (int)parse_int(name, value, 0, INT_MAX);
    else if (streq(opt, "--min-p")) o->min_p = parse_float(name, value, 0.0f, 1.0f, 0);
    else if (streq(opt, "--repeat-penalty")) o->repeat_penalty = parse_float(name, value, 0.0f, 100.0f, 1);
    else if (streq(opt, "--seed")) o->seed = parse_seed(name, value);
    else if (streq(opt, "--steps")) o->steps = (int)parse_int(name, value, 0, INT_MAX);
    else if (streq(opt, "--input")) o->prompt = value;
    else if (streq(opt, "--prompt-ids")) o->prompt_ids = value;
    else if (streq(opt, "--thinking")) o->thinking = (int)parse_int(name, value, 0, 1);
    else if (streq(opt, "--show-thinking")) o->show_thinking = (int)parse_int(name, value, 0, 1);
    else if (streq(opt, "--no-think")) o->thinking = 0; /* the official template's switch-off */
    else if (streq(opt, "--hide-think")) o->show_thinking = 0;
    else if (streq(opt, "--mode")) set_mode(o, name, value);
    else if (streq(opt, "--ctx")) o->ctx = (int)parse_int(name, value, 0, INT_MAX);
    else if (streq(opt, "--threads")) set_threads(o, name, value);
    else if (streq(opt, "--kv-cache")) o->kv_type = parse_kv_type(name, value);
    else if (streq(opt, "--show-norms")) o->show_norms = streq(value, "all") ? 2 : 1;
    else if (streq(opt, "--ablate")) {
        char err[160];
        if (norm_lab_parse_ablate(&o->norm_lab, value, err, sizeof err) != 0) die(2, "%s", err);
    }
    else if (streq(opt, "--norm-eps")) o->norm_lab.eps = parse_float(name, value, 0.0f, 100.0f, 0);
    else if (streq(opt, "--norm"))
        o->norm_lab.variant = (o->norm_lab.variant & ~NORM_VARIANT_CENTER) |
                              (parse_choice(name, value, "rmsnorm", "layernorm") ? NORM_VARIANT_CENTER : 0);
    else if (streq(opt, "--bench-prompt")) o->bench.len[0] = (int)parse_int(name, value, 0, 1000000);
    else if (streq(opt, "--bench-gen")) o->bench.len[1] = (int)parse_int(name, value, 0, 1000000);
    else if (streq(opt, "--bench-reps")) o->bench.reps = (int)parse_int(name, value, 1, 1000000);
    else if (streq(opt, "--bench-depth")) o->bench.depth = (int)parse_int(name, value, 0, 1000000);
}

/* The option called name (short or long), or -1. */
static int find_option(const char* name) {
    for (int k = 0; k < N_OPTIONS; k++) {
        const OptionSpec* s = &OPTIONS[k];
        if (s->long_name && (streq(name, s->long_name) || (s->short_name && streq(name, s->short_name)))) return k;
    }
    return -1;
}

/* The value the option long_name was given last ("" for a switch), or NULL when it was not. */
static const char* given(const Options* o, const char* long_name) { return o->given[find_option(long_name)]; }

/* The option's name in arg ("--temperature" of "--temperature=0.5") into name[64], and where its
 * "=value" starts (NULL when none). Returns 0 when the name does not fit. */
static int option_name(const char* arg, char name[64], const char** eq) {
    *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    const size_t len = *eq ? (size_t)(*eq - arg) : strlen(arg);
    if (len >= 64) return 0;
    memcpy(name, arg, len);
    name[len] = '\0';
    return 1;
}

/* The option at argv[i]: a switch, "-t 0.5", "--temperature 0.5" or "--temperature=0.5" (and the one
 * switch with a value, "--show-norms=all"). Returns how many of the following arguments it took as
 * its value (0 or 1). */
static int parse_option(Options* o, int argc, char** argv, int i) {
    const char* arg = argv[i];
    const char* eq;
    char name[64];
    if (!option_name(arg, name, &eq)) die(2, "unknown option '%s' (see --help)", arg);
    const int k = find_option(name);
    if (k < 0) die(2, "unknown option '%s' (see --help)", arg);
    const OptionSpec* spec = &OPTIONS[k];
    const char* value = eq ? eq + 1 : "";
    if (spec->arg == NULL && eq && !streq(arg, "--show-norms=all")) {
        if (streq(name, "--show-norms")) die(2, "--show-norms takes no value or =all, got '%s'", arg);
        die(2, "option %s takes no value, got '%s'", name, arg);
    }
    if (spec->arg && !eq) {
        if (i + 1 == argc) die(2, "option %s needs a value (see --help)", name);
        value = argv[i + 1];
    }
    if (spec->arg && streq(spec->arg, "PATH") && !value[0]) die(2, "%s needs a file name", spec->long_name);
    if (o->given[k] == NULL) o->order[o->n_given++] = k;
    o->given[k] = value;
    set_option(o, spec->long_name, name, value);
    return spec->arg && !eq;
}

/* 1 when the mode's value is "quantize" (-m quantize, --mode quantize, --mode=quantize): that mode
 * takes its own options (quantize.h). The value of every option that takes one, this table's and
 * quantize's, is skipped, so a prompt or a file name never reads as the mode. */
static int quantize_requested(int argc, char** argv) {
    static const char* const quantize_values[] = {"--dtype", "-o", "--output", "--group-size"};
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') continue;
        const char* eq;
        char name[64];
        if (!option_name(arg, name, &eq)) continue;
        const int k = find_option(name);
        int takes_value = k >= 0 && OPTIONS[k].arg != NULL;
        for (size_t q = 0; q < sizeof quantize_values / sizeof *quantize_values; q++)
            takes_value |= streq(name, quantize_values[q]);
        if (!takes_value || eq) {
            if (eq && streq(name, "--mode") && streq(eq + 1, "quantize")) return 1;
            continue;
        }
        if (i + 1 < argc && (streq(name, "-m") || streq(name, "--mode")) && streq(argv[i + 1], "quantize")) return 1;
        i++;
    }
    return 0;
}

/* Options that contradict each other. */
static void check_combinations(const Options* o) {
    if (o->checkpoint == NULL) {
        usage(stderr);
        die(2, "no checkpoint given");
    }
    if (o->prompt && o->prompt_ids) die(2, "give either -i or --prompt-ids, not both");
    if (o->bench.n_threads > 1 && o->mode != BENCH)
        die(2, "--threads takes a list of counts only in bench mode (-m bench), got '%s'", given(o, "--threads"));
    for (int k = 1; k < o->bench.n_threads; k++)
        for (int j = 0; j < k; j++)
            if (o->bench.threads[j] == o->bench.threads[k])
                die(2, "--threads %s: %d is there twice", given(o, "--threads"), o->bench.threads[k]);
    /* --prompt-ids or --file would leave chat reading standard input instead, an error. */
    if (o->prompt_ids && !(o->mode & (GENERATE | EVAL | TOKENIZE)))
        die(2, "--prompt-ids is for generate, eval and tokenize mode, not -m %s", o->mode_name);
    if (given(o, "--file") && o->mode == CHAT && !o->prompt)
        die(2, "-m chat takes no --file: its messages come from standard input, one a line (./run MODEL -m chat "
            "< FILE), or one from -i TEXT");
    /* the files written as the run goes: never "-" (standard output carries the text), the checkpoint
     * or the text read */
    for (const char** f = (const char*[]){"--dump-logits", "--norms-json", NULL}; *f; f++) {
        const char* out = given(o, *f);
        if (out == NULL || !(OPTIONS[find_option(*f)].modes & o->mode)) continue;
        if (streq(out, "-")) die(2, "%s -: its output goes to a file (standard output carries the text)", *f);
        const char* text = given(o, "--file");
        if (same_file(out, o->checkpoint) || (text && same_file(out, text)))
            die(2, "%s: is the %s; %s would write over it: give another file", out,
                same_file(out, o->checkpoint) ? "checkpoint" : "text file (-f)", *f);
    }
    if ((o->mode & (GENERATE | EVAL | TOKENIZE)) &&
        (o->prompt != NULL) + (o->prompt_ids != NULL) + (given(o, "--file") != NULL) > 1)
        die(2, "-m %s takes one text: give one of -i, --file and --prompt-ids", o->mode_name);
    if (o->mode == BENCH && o->bench.len[0] <= 0 && o->bench.len[1] <= 0)
        die(2, "nothing to measure: --bench-prompt and --bench-gen are both 0");
}

/* Options of another mode do nothing in this one, which a note per kind of option says, e.g.
 * "run: note: -m tokenize ignores --seed and --steps (generate and chat options)". */
static void note_other_mode_options(const Options* o) {
    static const struct { int modes; const char* whose; } kinds[] = {
        {CHAT, "-m chat"}, {GENERATE, "-m generate"}, {GENERATE | CHAT, "generate and chat"},
        {GENERATE | CHAT | TOKENIZE | EVAL, "generate, chat, tokenize and eval"}, {BENCH, "-m bench"},
        {BENCH | EVAL, "-m bench and -m eval"}, {EVAL, "-m eval"}, {GENERATE | CHAT | EVAL, "generate, chat and eval"},
        {GENERATE | EVAL, "generate and eval"}, {GENERATE | EVAL | TOKENIZE, "generate, eval and tokenize"},
    };
    int noted[N_OPTIONS] = {0};
    for (size_t g = 0; g <= sizeof kinds / sizeof kinds[0]; g++) {
        const int last = g == sizeof kinds / sizeof kinds[0]; /* any left: a kind the table lacks */
        if (!last && (kinds[g].modes & o->mode)) continue;
        const char* hit[N_OPTIONS];
        int n = 0;
        for (int k = 0; k < o->n_given; k++) {
            const int opt = o->order[k], modes = OPTIONS[opt].modes;
            if (last ? !(modes & o->mode) && !noted[opt] : modes == kinds[g].modes) {
                hit[n++] = OPTIONS[opt].long_name;
                noted[opt] = 1;
            }
        }
        if (n == 0) continue;
        fprintf(stderr, "run: note: -m %s ignores ", o->mode_name);
        for (int k = 0; k < n; k++) fprintf(stderr, "%s%s", k == 0 ? "" : k == n - 1 ? " and " : ", ", hit[k]);
        if (last) fprintf(stderr, " (another mode's option%s)\n", n > 1 ? "s" : "");
        else fprintf(stderr, " (%s option%s)\n", kinds[g].whose, n > 1 ? "s" : "");
    }
}

static void parse_args(int argc, char** argv, Options* o) {
    *o = (Options){.mode = GENERATE, .mode_name = MODE_NAMES[0], .steps = 256, .repeat_penalty = 1.0f,
                   .thinking = 1, .show_thinking = 1, .bench = BENCH_DEFAULTS};
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (arg[0] == '-' && arg[1] != '\0') i += parse_option(o, argc, argv, i);
        else if (o->checkpoint) die(2, "unexpected argument '%s' (the checkpoint is '%s')", arg, o->checkpoint);
        else o->checkpoint = arg;
    }
    o->norm_lab.has_eps = given(o, "--norm-eps") != NULL;
    o->bench.given[0] = given(o, "--bench-prompt") != NULL;
    o->bench.given[1] = given(o, "--bench-gen") != NULL;
    o->bench.json = given(o, "--json") != NULL;
    check_combinations(o);
    note_other_mode_options(o);
}

/* --show-norms traces the prompt's last token, the one whose logits pick the first generated token;
 * --show-norms=all and --norms-json every position that goes through forward(), the prompt's and
 * each generated token fed back. The table goes to a temporary file and is printed to stderr after
 * the text, into which it would otherwise cut. The streams' buffers are static so that the token
 * loop allocates nothing. */
static void trace_open(NormTrace* tr, Transformer* t, const Options* o, int n_prompt) {
    static char table_buf[1 << 16], json_buf[1 << 16];
    const char* json_path = given(o, "--norms-json");
    memset(tr, 0, sizeof *tr);
    if (!o->show_norms && !json_path) return;
    tr->pos = o->show_norms == 1 ? n_prompt - 1 : -1;
    tr->each_head = o->show_norms == 2;
    tr->lab = norm_lab_active(&o->norm_lab) ? &o->norm_lab : NULL; /* what the lab applies is what is shown */
    tr->scratch = malloc((size_t)(t->config.dim > t->config.head_dim ? t->config.dim : t->config.head_dim) *
                         sizeof(float));
    if (tr->scratch == NULL) die(1, "out of memory");
    if (o->show_norms) {
        tr->table = tmpfile();
        if (tr->table == NULL) die(1, "--show-norms: cannot create a temporary file: %s", strerror(errno));
        setvbuf(tr->table, table_buf, _IOFBF, sizeof table_buf);
    }
    if (json_path) {
        tr->json = fopen(json_path, "w");
        if (tr->json == NULL) die(1, "%s: cannot open for writing: %s", json_path, strerror(errno));
        setvbuf(tr->json, json_buf, _IOFBF, sizeof json_buf);
        output_path_written(tr->json, json_path, tr->json_written, sizeof tr->json_written);
    }
    norm_trace_attach(tr, t);
}

/* The table to stderr; the JSON file closed (where it is a regular file, removed if it could not be
 * written whole, as --dump-logits). */
static void trace_close(NormTrace* tr, const char* json_path) {
    if (tr->table) {
        fflush(stdout); /* the text's last line before the table, where both go to one place */
        char chunk[4096];
        size_t got;
        if (fflush(tr->table) != 0 || fseek(tr->table, 0, SEEK_SET) != 0)
            die(1, "--show-norms: the temporary file could not be written");
        while ((got = fread(chunk, 1, sizeof chunk, tr->table)) > 0) fwrite(chunk, 1, got, stderr);
        fclose(tr->table);
    }
    if (tr->json) {
        errno = 0;
        int err = fflush(tr->json) != 0 || ferror(tr->json) ? (errno ? errno : EIO) : 0;
        if (fclose(tr->json) != 0 && err == 0) err = errno;
        if (err) {
            if (tr->json_written[0]) remove(tr->json_written);
            die(1, "%s: write failed: %s", json_path, strerror(err));
        }
    }
    free(tr->scratch);
}

/* The text of -i, of the file path or of standard input, encoded (malloc'ed): tokenize and eval. */
static int* encode_text(const Tokenizer* tok, const char* text, const char* path, int* n) {
    size_t len;
    char* s = read_text(text, path, &len);
    if (s == NULL) exit(1);
    int* ids = tokenizer_encode(tok, s, len, n);
    if (ids == NULL) die(1, "out of memory");
    free(s);
    return ids;
}

/* The prompt (malloc'ed): ids given as such, or encoded text after BOS when the model has one
 * (Qwen3 has none, QWEN3.md 2.3). Ends the run when it is empty or longer than the context;
 * --verbose-prompt shows its ids. */
static int* read_prompt(const Transformer* t, const Tokenizer* tok, const Options* o, int* n_prompt) {
    const Config* c = &t->config;
    const int bos = t->header.bos_id >= 0;
    int* prompt;
    if (o->prompt_ids) {
        prompt = parse_prompt_ids(o->prompt_ids, c->vocab_size, n_prompt);
    } else {
        const char* file = given(o, "--file");
        if ((o->prompt || file) && tok == NULL) die(1, "%s has no tokenizer: give the prompt with --prompt-ids", o->checkpoint);
        int n_text = 0;
        if (file && streq(file, "-") && isatty(STDIN_FILENO))
            fputs("run: reading the prompt from standard input: type it, then Ctrl-D on a new line\n", stderr);
        int* text = o->prompt || file ? encode_text(tok, o->prompt, file, &n_text) : NULL;
        prompt = malloc((size_t)(n_text + bos + 1) * sizeof(int));
        if (prompt == NULL) die(1, "out of memory");
        if (bos) prompt[0] = t->header.bos_id;
        if (text) memcpy(prompt + bos, text, (size_t)n_text * sizeof(int));
        *n_prompt = n_text + bos;
        free(text);
        for (int i = 0; i < *n_prompt; i++)
            if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
                die(1, "the tokenizer gave id %d, outside the model's vocabulary of %d", prompt[i], c->vocab_size);
    }
    if (*n_prompt == 0 || *n_prompt > c->seq_len) { /* the run ends here, with nothing left allocated */
        free(prompt);
        const char* file = given(o, "--file");
        if (*n_prompt == 0 && o->prompt) die(2, "the prompt (-i) is empty and the model has no BOS token to start from");
        if (*n_prompt == 0 && file)
            die(2, "%s is empty: no prompt, and the model has no BOS token to start from",
                streq(file, "-") ? "standard input" : file);
        if (*n_prompt == 0) die(2, "no prompt: give -i TEXT, -f FILE (- for standard input) or --prompt-ids IDS");
        if (*n_prompt > c->max_seq_len)
            die(1, "the prompt has %d tokens, more than the model's context of %d positions", *n_prompt, c->max_seq_len);
        die(1, "the prompt has %d tokens, more than the context of %d (raise it with -c, at most %d)", *n_prompt,
            c->seq_len, c->max_seq_len);
    }
    if (given(o, "--verbose-prompt"))
        print_token_ids(prompt, *n_prompt, "run: prompt of %d token%s:", *n_prompt, *n_prompt == 1 ? "" : "s");
    return prompt;
}

/* Runs the prompt, then samples, prints and feeds back one token at a time until an end-of-sequence
 * id, -n tokens, the end of the context or Ctrl-C. Returns the tokens generated. */
static int generate(Transformer* t, const Tokenizer* tok, Sampler* sampler, const Options* o) {
    const Config* c = &t->config;
    int n_prompt = 0;
    /* Everything the token loop needs is allocated here, before it. The tokens seen, for the
     * repetition penalty: the prompt, then the rest of the context plus one last token. */
    int* history = realloc(read_prompt(t, tok, o, &n_prompt), ((size_t)c->seq_len + 2) * sizeof(int));
    if (history == NULL) die(1, "out of memory");
    LogitsDump dump;
    if (logits_dump_open(&dump, given(o, "--dump-logits"), t) != 0) exit(1);
    NormTrace trace;
    trace_open(&trace, t, o, n_prompt);
    /* Ctrl-C: the prompt stops before its next chunk, the decode before its next token, and the run
     * ends as it would (the text so far, the speed line) with status 130. */
    struct sigaction old_int;
    catch_ctrl_c(&old_int);
    const double t0 = now_seconds();
    PromptProgress progress = {.label = "run", .show = isatty(STDERR_FILENO), .stop = &ctrl_c_pressed}; /* on a terminal */
    int stopped = 0;
    float* logits = forward_prompt(t, history, n_prompt, 0, &dump, prompt_progress, &progress, &stopped);
    prompt_progress_end(&progress);
    if (stopped) {
        fprintf(stderr, "run: interrupted during the prompt of %d tokens, after %.1f s\n", n_prompt, now_seconds() - t0);
        exit(130);
    }
    if (logits == NULL) exit(1);
    const double t1 = now_seconds();
    double first_token = 0; /* seconds from the prompt's start to the first token printed */
    if (o->prompt && tok) { /* show the prompt, then the continuation, as llama2.c does */
        fputs(o->prompt, stdout);
        fflush(stdout);
    }
    if (trace.pos >= 0 && trace.json == NULL)
        norm_trace_detach(&trace, t); /* the prompt's last token has been through every call site */
    Utf8Stream stream = {{0}, 0, isatty(STDOUT_FILENO)};
    int n = n_prompt; /* tokens in history, one more than the positions run */
    int n_decoded = 0, context_full = 0, nan_at = -1;
    while (n - n_prompt < o->steps && !ctrl_c_pressed) {
        int next = sampler_sample(sampler, logits, history, n);
        if (next < 0) { /* said once the trace (--show-norms) is out: it shows where */
            nan_at = n - 1;
            break;
        }
        if (is_eos(&t->header, next)) break;
        if (tok) tokenizer_print(tok, &stream, next, 0, stdout);
        else printf("%s%d", n > n_prompt ? " " : "", next); /* no tokenizer: the ids */
        fflush(stdout);
        if (first_token == 0) first_token = now_seconds() - t0;
        if (ferror(stdout)) { /* nobody reads what follows; check_stdout reports it */
            stdout_errno = errno;
            break;
        }
        history[n++] = next;
        /* The last token is only run through the model when its logits are wanted. */
        if (n - n_prompt == o->steps && dump.file == NULL) break;
        context_full = n > c->seq_len;
        if (context_full) break;
        logits = forward_dumped(t, &next, 1, n - 1, &dump);
        if (logits == NULL) exit(1);
        n_decoded++;
    }
    if (tok) utf8_stream_flush(&stream, stdout);
    const double t2 = now_seconds();
    norm_trace_detach(&trace, t);
    if (n > n_prompt || (o->prompt && tok)) fputc('\n', stdout);
    check_stdout();
    trace_close(&trace, given(o, "--norms-json"));
    if (context_full) {
        char advice[80];
        fprintf(stderr, "run: the context is full (%d token%s): generation stopped; %s\n", c->seq_len,
                c->seq_len == 1 ? "" : "s", context_advice(c, advice, sizeof advice));
    }
    if (logits_dump_close(&dump) != 0) exit(1);
    if (nan_at >= 0)
        die(1, "every logit at position %d is NaN (" NAN_LOGITS_WHY ": the RMSNorm lab's switches can do that)",
            nan_at);
    if (ctrl_c_pressed) fputs("run: interrupted\n", stderr);
    print_speed(n_prompt, t1 - t0, n - n_prompt, n_decoded, t2 - t1, first_token);
    release_ctrl_c(&old_int);
    free(history);
    return n - n_prompt;
}

/* -m tokenize: the text's ids on one line; with --prompt-ids the other way, the ids' text exactly as
 * the tokenizer decodes it (special tokens included, no newline added: a file's ids give the file). */
static int tokenize(const Tokenizer* tok, const Options* o) {
    if (tok == NULL) die(1, "%s has no tokenizer: tokenize needs one (export with tokenizer.json)", o->checkpoint);
    if (o->prompt_ids) {
        int n = 0; /* "" (an empty text's ids): no text */
        int* ids = o->prompt_ids[0] ? parse_prompt_ids(o->prompt_ids, tokenizer_size(tok), &n) : NULL;
        size_t len;
        char* text = tokenizer_decode(tok, ids, n, 0, &len);
        if (text == NULL) die(1, "out of memory");
        fwrite(text, 1, len, stdout);
        check_stdout();
        free(text);
        free(ids);
        return 0;
    }
    const char* file = given(o, "--file");
    if (o->prompt == NULL && (file == NULL || streq(file, "-")) && isatty(STDIN_FILENO))
        fputs("run: reading the text to tokenize from standard input: type it, then Ctrl-D on a new line "
              "(or pass -i TEXT or -f FILE)\n", stderr);
    int n = 0;
    int* ids = encode_text(tok, o->prompt, file, &n);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    check_stdout();
    free(ids);
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

/* More threads than the CPUs this process may run on only take turns on them, so --threads is held
 * to that number, with a note; a bench list's larger counts then run with it too (kernels_set_threads
 * never exceeds the pool's size). */
static void clamp_threads(Options* o) {
    const int cpus = usable_cpus();
    if (o->threads <= 0 || cpus < 1 || o->threads <= cpus) return;
    if (o->bench.n_threads > 1) {
        fprintf(stderr, "run: note: --threads %s: counts above the %d CPU%s this process may run on are run with %d, "
                "once\n", given(o, "--threads"), cpus, cpus == 1 ? "" : "s", cpus);
        BenchOptions* b = &o->bench; /* each count once: those above cpus become cpus */
        int n = 0;
        for (int k = 0; k < b->n_threads; k++) {
            const int t = b->threads[k] > cpus ? cpus : b->threads[k];
            int seen = 0;
            for (int j = 0; j < n; j++) seen |= b->threads[j] == t;
            if (!seen) b->threads[n++] = t;
        }
        b->n_threads = n;
        o->threads = cpus;
    } else
        o->threads = threads_held(o->threads);
}

/* The RMSNorm lab's switches (cli/norm_lab.h) set on the model, with a note where one changes
 * nothing. */
static void apply_norm_lab(Transformer* t, NormLabOps* lab, const Options* o) {
    char err[200];
    if (norm_lab_attach(lab, t, &o->norm_lab, err, sizeof err) != 0) {
        transformer_free(t);
        die(2, "%s", err);
    }
    for (int k = 0; k < o->norm_lab.n; k++)
        if ((o->norm_lab.sw[k].skip & NORM_SKIP_QK) && !(t->config.flags & FLAG_QK_NORM))
            fprintf(stderr, "run: note: --ablate %.*s changes nothing: this model has no QK-Norm\n",
                    o->norm_lab.sw[k].text_len, o->norm_lab.sw[k].text);
}

static int run_eval(Transformer* t, const Tokenizer* text_tok, const Options* o) {
    int n = 0;
    int* ids = NULL;
    if (o->prompt_ids) ids = parse_prompt_ids(o->prompt_ids, t->config.vocab_size, &n);
    else if (text_tok) ids = encode_text(text_tok, o->prompt, given(o, "--file"), &n);
    else die(1, "the checkpoint has no tokenizer: give the tokens with --prompt-ids");
    char* switches = norm_lab_json(&o->norm_lab);
    if (switches == NULL) die(1, "out of memory");
    const int status = eval_main(t, ids, n, given(o, "--json") != NULL, switches);
    free(switches);
    free(ids);
    return status;
}

/* The KV cache's positions: -c, or in bench mode without it what the tests take when that is more
 * than the default (bench_positions; the model's context still bounds it). */
static int context_positions(const Options* o) {
    if (o->mode != BENCH || o->ctx > 0) return o->ctx;
    const int need = bench_positions(&o->bench);
    return need > DEFAULT_CTX ? need : 0;
}

/* Generate and chat: the sampler, then the mode. */
static int run_sampling_mode(Transformer* t, const Tokenizer* text_tok, const Options* o) {
    /* Sampling defaults: the model's generation_config (0 in the header means absent), else
     * llama2.c's 1.0 / 0.9, and no top-k. A no-think chat follows Qwen's advice for that mode
     * instead (QWEN3.md 1.2: temperature 0.7, top-p 0.8, top-k 20); the thinking mode's advice
     * (0.6, 0.95, 20) is what Qwen3's generation_config holds. */
    const FileHeader* h = &t->header;
    const int no_think_chat = o->mode == CHAT && !o->thinking;
    float temperature = no_think_chat ? 0.7f : h->temperature > 0 ? h->temperature : 1.0f;
    float top_p = no_think_chat ? 0.8f : h->top_p > 0 ? h->top_p : 0.9f;
    int top_k = no_think_chat ? 20 : h->top_k;
    if (given(o, "--temperature")) temperature = o->temperature;
    if (given(o, "--top-p")) top_p = o->top_p;
    if (given(o, "--top-k")) top_k = o->top_k;
    const uint64_t seed = given(o, "--seed") ? o->seed : seed_from_clock();
    Sampler sampler;
    if (sampler_init(&sampler, t->config.vocab_size, temperature, top_p, top_k, o->min_p, o->repeat_penalty,
                     seed) != 0)
        die(1, "out of memory");
    int status = 0, n_generated = 0;
    if (o->mode == CHAT) {
        ChatOptions chat = {given(o, "--system"), o->prompt, given(o, "--steps") ? o->steps : 0, o->thinking,
                            o->show_thinking, given(o, "--keep-thinking") != NULL,
                            given(o, "--verbose-prompt") != NULL, given(o, "--dump-logits"), o->checkpoint};
        if (text_tok == NULL) die(1, "%s has no tokenizer: chat needs one (export with tokenizer.json)", o->checkpoint);
        if (o->prompt && !o->prompt[strspn(o->prompt, " \t\r\n\v\f")]) /* as the chat skips a blank line */
            die(2, "the message (-i) is empty");
        status = chat_main(t, text_tok, &sampler, &chat, &n_generated);
    } else {
        n_generated = generate(t, text_tok, &sampler, o);
        if (ctrl_c_pressed) status = 130; /* as a shell reports a run that Ctrl-C ended */
    }
    /* A seed from the clock is printed, so that the run can be repeated. */
    if (!given(o, "--seed") && temperature > 0 && n_generated > 0)
        fprintf(stderr, "seed: %llu (from the clock; -s %llu repeats this %s)\n", (unsigned long long)seed,
                (unsigned long long)seed, o->mode == CHAT ? "chat" : "run");
    sampler_free(&sampler);
    return status;
}

/* Whether the load leaves the file's pages to come in as the run reads them (lazy_pages): for
 * tokenize, which reads no weights, and for a file larger than the memory available to it
 * (cli/available_memory.h), whose first pages a whole read would drop again before a token reached
 * them (docs/design.md#mapped-weights); the run then says why it will be slow. */
static int read_as_needed(const Options* o) {
    if (o->mode == TOKENIZE) return 1;
    struct stat st;
    const long long room = available_memory();
    if (stat(o->checkpoint, &st) != 0 || room < 0 || (long long)st.st_size <= room) return 0;
    fprintf(stderr, "run: note: %s (%.1f GB) is larger than the memory available to it (%.1f GB): its weights are "
            "read from the disk as tokens need them, at the disk's pace\n", o->checkpoint, st.st_size / 1e9, room / 1e9);
    return 1;
}

/* Every matrix's input width a multiple of 32: q8 could be exported in groups the SIMD products take. */
static int widths_take_groups_of_32(const Config* c) {
    return c->dim % 32 == 0 && c->hidden_dim % 32 == 0 && (c->n_heads * c->head_dim) % 32 == 0 &&
           (c->n_experts == 0 || c->moe_hidden_dim % 32 == 0);
}

/* A standard stream the caller closed (`<&-`, `>&-`) is opened on /dev/null for reading only, before
 * anything else opens a file: else the next file opened (a worker's /proc file, the dump file) takes
 * its number, and the prompt is read from it or the text written into it. Read-only, a closed
 * stdin reads as empty and a write to a closed stdout fails as it would have. */
static void hold_standard_streams(void) {
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) (void)open("/dev/null", O_RDONLY); /* the lowest free number: fd */
}

int main(int argc, char** argv) {
    hold_standard_streams();
    if (quantize_requested(argc, argv)) return quantize_main(argc, argv); /* its own options: quantize.h */
    Options o;
    parse_args(argc, argv, &o);
    clamp_threads(&o);
    /* on a terminal, how far the file is read (a large model the page cache does not hold takes as
     * long as the disk needs) */
    LoadProgress loading = {.label = "run", .path = o.checkpoint, .show = isatty(STDERR_FILENO), .start = now_seconds()};
    const TransformerOptions topt = {.threads = o.threads, .ctx = context_positions(&o), .kv_type = o.kv_type,
                                     .bf16_activations = given(&o, "--bf16-activations") != NULL,
                                     .prefill_only = o.mode == TOKENIZE || o.mode == EVAL,
                                     .lazy_pages = read_as_needed(&o),
                                     .load_progress = load_progress, .load_progress_ctx = &loading};
    Transformer t;
    char err[512];
    const int loaded = transformer_load(&t, o.checkpoint, &topt, err, sizeof err);
    load_progress_end(&loading);
    if (loaded != 0) die(1, "%s", err);
    if (o.ctx > t.config.max_seq_len)
        fprintf(stderr, "run: note: -c %d is more than the model's maximum context of %d; using %d\n", o.ctx,
                t.config.max_seq_len, t.config.max_seq_len);
    if (o.mode != TOKENIZE && t.config.weight_type == WEIGHT_Q8 && t.config.group_size % 32 &&
        strcmp(t.kernels->name, "reference") != 0)
        fprintf(stderr, "run: note: q8 groups of %d: the SIMD products take groups of a multiple of 32, so this "
                "model's run on the scalar reference, tens of times slower%s\n", t.config.group_size,
                widths_take_groups_of_32(&t.config) ? " (export with the default group size)" : "");
    /* the reference build runs one thread whatever it is asked (the bench's list says so itself) */
    if (o.threads > 1 && t.kernels->threads(t.kernels) < o.threads && (o.mode != BENCH || o.bench.n_threads <= 1))
        fprintf(stderr, "run: note: --threads %s: these kernels (%s) run %d thread%s\n", given(&o, "--threads"),
                t.kernels->name, t.kernels->threads(t.kernels), t.kernels->threads(t.kernels) == 1 ? "" : "s");
    if (topt.bf16_activations && !t.kernels->bf16_activations)
        fprintf(stderr, "run: note: --bf16-activations ignored: this build has no bf16 dot product (AVX-512 BF16)\n");
    Tokenizer* tok = tokenizer_new(t.tokenizer_data, t.tokenizer_bytes, err, sizeof err);
    if (tok == NULL) {
        transformer_free(&t);
        die(1, "%s: tokenizer: %s", o.checkpoint, err);
    }
    const Tokenizer* text_tok = tokenizer_size(tok) > 0 ? tok : NULL; /* NULL: ids only */
    /* The RMSNorm lab's switches change the forward pass of the modes that run the model on text. */
    NormLabOps lab;
    if (o.mode & (GENERATE | CHAT | EVAL)) apply_norm_lab(&t, &lab, &o);
    int status;
    if (o.mode == TOKENIZE) status = tokenize(text_tok, &o);
    else if (o.mode == EVAL) status = run_eval(&t, text_tok, &o);
    else if (o.mode == BENCH) status = bench_main(&t, &o.bench);
    else status = run_sampling_mode(&t, text_tok, &o);
    tokenizer_free(tok);
    transformer_free(&t);
    if (status == 0) check_stdout(); /* the bench's table, the chat's answers */
    return status;
}
