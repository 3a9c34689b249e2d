// Tiny client of the llama.cpp library (our code, linked against the peer build;
// no llama.cpp source is copied here). Feeds token ids, greedily generates N
// tokens, and prints JSON with the generated ids, the top-k logits of every
// step and, optionally, the full logits of the prompt's last position.
//
// Build (see build_llama_logits.sh):
//   c++ -O2 -std=c++17 -I$LLAMA_CPP_DIR/include -I$LLAMA_CPP_DIR/ggml/include \
//       llama_logits.cpp -L... -lllama -lggml -lggml-cpu -lggml-base -fopenmp -lpthread
//
// Usage: llama_logits MODEL "1,2,3" N_GEN [--threads T] [--kv-f32] [--ctx N]
//                     [--top K] [--full-logits] [--dump DIR --dump-names a,b,c]
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

static void print_top(const float * logits, int n_vocab, int k) {
    std::vector<int> idx(n_vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    printf("[");
    for (int i = 0; i < k; i++) {
        printf("%s[%d, %.9g]", i ? ", " : "", idx[i], logits[idx[i]]);
    }
    printf("]");
}

// --dump DIR: write every graph tensor of the FIRST decode whose name is in the
// comma separated --dump-names list as raw little-endian f32 (DIR/NAME.f32).
static std::string g_dump_dir;
static std::vector<std::string> g_dump_names;
static bool g_dump_active = true;

static bool dump_cb(struct ggml_tensor * t, bool ask, void *) {
    if (!g_dump_active || g_dump_dir.empty()) return ask ? false : true;
    bool wanted = t->type == GGML_TYPE_F32 &&
        std::find(g_dump_names.begin(), g_dump_names.end(), std::string(t->name)) != g_dump_names.end();
    if (ask) return wanted;
    if (!wanted) return true;
    std::vector<float> buf(ggml_nelements(t));
    if (!ggml_is_contiguous(t)) return true;
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    std::string path = g_dump_dir + "/" + t->name + ".f32";
    FILE * f = fopen(path.c_str(), "wb");
    if (f) { fwrite(buf.data(), sizeof(float), buf.size(), f); fclose(f); }
    return true;
}

static std::string json_escape(const std::string & s) {
    std::string o;
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            default:
                if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
                else o += (char) c;
        }
    }
    return o;
}

static int argmax(const float * logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL IDS(comma separated) N_GEN [--threads T] [--kv-f32] [--ctx N] [--top K] [--full-logits]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    std::vector<llama_token> prompt;
    {
        std::stringstream ss(argv[2]);
        std::string item;
        while (std::getline(ss, item, ',')) {
            item.erase(std::remove_if(item.begin(), item.end(), [](char c) { return c == '[' || c == ']' || c == ' '; }), item.end());
            if (!item.empty()) prompt.push_back(std::atoi(item.c_str()));
        }
    }
    int n_gen = std::atoi(argv[3]);
    int threads = 2, n_ctx = 0, top = 5;
    bool kv_f32 = false, full = false;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) n_ctx = std::atoi(argv[++i]);
        else if (!strcmp(argv[i], "--top") && i + 1 < argc) top = std::atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-f32")) kv_f32 = true;
        else if (!strcmp(argv[i], "--full-logits")) full = true;
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) g_dump_dir = argv[++i];
        else if (!strcmp(argv[i], "--dump-names") && i + 1 < argc) {
            std::stringstream ss(argv[++i]);
            std::string n;
            while (std::getline(ss, n, ',')) g_dump_names.push_back(n);
        }
        else { fprintf(stderr, "unknown arg %s\n", argv[i]); return 2; }
    }
    if (n_ctx == 0) n_ctx = (int) prompt.size() + n_gen + 8;

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = std::max<int>(n_ctx, 512);
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    if (kv_f32) { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    if (!g_dump_dir.empty()) { cp.cb_eval = dump_cb; cp.cb_eval_user_data = nullptr; }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }

    printf("{\"prompt\": [");
    for (size_t i = 0; i < prompt.size(); i++) printf("%s%d", i ? ", " : "", prompt[i]);
    printf("], \"kv_type\": \"%s\", \"steps\": [", kv_f32 ? "f32" : "f16");

    std::vector<llama_token> generated;
    llama_batch batch = llama_batch_get_one(prompt.data(), (int32_t) prompt.size());
    std::vector<float> first_logits;
    for (int step = 0; step < n_gen; step++) {
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        g_dump_active = false;  // only the prompt's decode is dumped
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (step == 0 && full) first_logits.assign(logits, logits + n_vocab);
        llama_token next = argmax(logits, n_vocab);
        printf("%s{\"token\": %d, \"top\": ", step ? ", " : "", next);
        print_top(logits, n_vocab, top);
        printf("}");
        generated.push_back(next);
        batch = llama_batch_get_one(&generated.back(), 1);
    }
    printf("], \"generated\": [");
    for (size_t i = 0; i < generated.size(); i++) printf("%s%d", i ? ", " : "", generated[i]);
    printf("]");
    {
        std::string text;
        for (llama_token t : generated) {
            char buf[256];
            int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
            if (n > 0) text.append(buf, n);
        }
        printf(", \"generated_text\": \"%s\"", json_escape(text).c_str());
    }
    if (full) {
        printf(", \"prompt_last_logits\": [");
        for (int i = 0; i < n_vocab; i++) printf("%s%.9g", i ? ", " : "", first_logits[i]);
        printf("]");
    }
    printf("}\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
