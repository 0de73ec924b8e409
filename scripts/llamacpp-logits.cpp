// llama.cpp's top logits after a prompt of token ids, then greedy decoding printing each step's
// top 5 and the gap between the first two. Built and run by scripts/llamacpp-logits.sh.
// With ALL=FILE in the environment: one pass over the prompt, every position's full logits written
// to FILE as JSON ({"ids": [...], "logits": [[...], ...]}), for scripts/arch-reference.sh.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <algorithm>
static void top(const float *lg, int nv, int k) {
    std::vector<int> idx(nv);
    for (int i = 0; i < nv; i++) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return lg[a] > lg[b]; });
    for (int i = 0; i < k; i++) printf(" %d:%.5f", idx[i], lg[idx[i]]);
    printf("  gap %.5f\n", lg[idx[0]] - lg[idx[1]]);
}
int main(int argc, char **argv) {
    std::vector<llama_token> toks;
    std::string s = argv[2];
    size_t p = 0;
    while (p < s.size()) { size_t q = s.find(',', p); if (q == std::string::npos) q = s.size(); toks.push_back(atoi(s.substr(p, q - p).c_str())); p = q + 1; }
    int n = atoi(argv[3]);
    int th = argc > 4 ? atoi(argv[4]) : 2;
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model *m = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = th; cp.n_threads_batch = th;
    if (getenv("FA")) cp.flash_attn_type = (llama_flash_attn_type) atoi(getenv("FA"));
    llama_context *c = llama_init_from_model(m, cp);
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    if (const char *all = getenv("ALL")) {
        llama_batch b = llama_batch_init(toks.size(), 0, 1);
        for (size_t i = 0; i < toks.size(); i++) {
            b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
        }
        b.n_tokens = toks.size();
        if (llama_decode(c, b) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }
        FILE *f = fopen(all, "w");
        fprintf(f, "{\"ids\": [");
        for (size_t i = 0; i < toks.size(); i++) fprintf(f, "%s%d", i ? ", " : "", toks[i]);
        fprintf(f, "],\n\"logits\": [\n");
        for (size_t i = 0; i < toks.size(); i++) {
            const float *lg = llama_get_logits_ith(c, i);
            fprintf(f, "[");
            for (int j = 0; j < nv; j++) fprintf(f, "%s%.8g", j ? "," : "", lg[j]);
            fprintf(f, "]%s\n", i + 1 < toks.size() ? "," : "");
        }
        fprintf(f, "]}\n");
        fclose(f);
        return 0;
    }
    llama_decode(c, llama_batch_get_one(toks.data(), toks.size()));
    for (int i = 0; i < n; i++) {
        const float *lg = llama_get_logits_ith(c, -1);
        printf("step %d:", i); top(lg, nv, 5);
        llama_token t = std::max_element(lg, lg + nv) - lg;
        llama_decode(c, llama_batch_get_one(&t, 1));
    }
    return 0;
}
