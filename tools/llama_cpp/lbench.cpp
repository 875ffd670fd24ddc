// lbench: what `llama-bench -p NP -n NG -r REPS -t THREADS [-d DEPTH]` measures, on llama.h's
// public API (the npm-carried sources have no llama-bench; build.sh builds this instead).
//   lbench MODEL.gguf THREADS NP NG REPS [DEPTH]
// A warm-up (one NP-token decode and one single-token decode), then REPS timed reps of one
// NP-token llama_decode of random ids, and REPS of NG single-token decodes, the memory cleared
// before each rep and then, with DEPTH, filled with DEPTH random tokens (untimed, as llama-bench's
// -d), so that each test starts at position DEPTH; n_batch 2048, n_ubatch 512, other context
// settings default (an f16 KV cache). Prints `ppNP THREADS t: mean ± sd tok/s [each rep]` and the
// same for tgNG, with ` @ dDEPTH` after the name when DEPTH > 0.
#include "llama.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

static void log_cb(enum lm_ggml_log_level level, const char * text, void *) {
    if (level == LM_GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}
static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char ** argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s MODEL.gguf THREADS NP NG REPS [DEPTH]\n", argv[0]); return 1; }
    const char * path = argv[1];
    const int nt = atoi(argv[2]), np = atoi(argv[3]), ng = atoi(argv[4]), reps = atoi(argv[5]);
    const int depth = argc > 6 ? atoi(argv[6]) : 0;
    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();   // mmap on by default, CPU-only build
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", path); return 1; }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = depth + np + ng + 16 > 4096 ? depth + np + ng + 16 : 4096;
    cp.n_batch = 2048; cp.n_ubatch = 512;
    cp.n_threads = nt; cp.n_threads_batch = nt;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::mt19937 rng(1234);
    auto rnd = [&]() { return (llama_token)(rng() % n_vocab); };
    llama_memory_t mem = llama_get_memory(ctx);

    auto decode_prompt = [&](int n) {   // n random tokens after what the memory holds, split by n_batch like llama-bench
        std::vector<llama_token> toks(n);
        for (auto & t : toks) t = rnd();
        for (int i = 0; i < n; i += (int)cp.n_batch) {
            int k = std::min(n - i, (int)cp.n_batch);
            if (llama_decode(ctx, llama_batch_get_one(toks.data() + i, k))) { fprintf(stderr, "decode failed\n"); exit(1); }
        }
        llama_synchronize(ctx);
    };
    auto decode_gen = [&](int n) {       // n single-token decodes
        for (int i = 0; i < n; i++) {
            llama_token t = rnd();
            if (llama_decode(ctx, llama_batch_get_one(&t, 1))) { fprintf(stderr, "decode failed\n"); exit(1); }
            llama_synchronize(ctx);
        }
    };
    auto report = [&](const char * name, int n, const std::vector<double> & ts) {
        double m = 0, s = 0;
        for (double x : ts) m += x;
        m /= ts.size();
        for (double x : ts) s += (x - m) * (x - m);
        s = ts.size() > 1 ? std::sqrt(s / (ts.size() - 1)) : 0.0;
        if (depth > 0) printf("%s%d @ d%d %d t: %8.2f ± %6.2f tok/s  [", name, n, depth, nt, m, s);
        else printf("%s%d %d t: %8.2f ± %6.2f tok/s  [", name, n, nt, m, s);
        for (size_t i = 0; i < ts.size(); i++) printf("%s%.2f", i ? ", " : "", ts[i]);
        printf("]\n");
        fflush(stdout);
    };

    // warm-up
    llama_memory_clear(mem, true);
    if (np > 0) decode_prompt(np);
    decode_gen(1);

    auto time_reps = [&](const char * name, int n, const std::function<void(int)> & run) {
        std::vector<double> ts;
        for (int r = 0; r < reps; r++) {
            llama_memory_clear(mem, true);
            if (depth > 0) decode_prompt(depth);
            double t0 = now_s(); run(n); ts.push_back(n / (now_s() - t0));
        }
        report(name, n, ts);
    };
    if (np > 0) time_reps("pp", np, decode_prompt);
    if (ng > 0) time_reps("tg", ng, decode_gen);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
