// Side check helper (tests/side/gemma4_llamacpp_check.py builds it): loads a
// GGUF with llama.cpp and prints, for each position of a token list, the
// log-probability of the next token and the largest logit.
// usage: llamacpp_logps FILE.gguf id0 id1 ...
// Output: "position logp(next token) largest logit", one line each.
#include "llama.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char ** argv) {
  if (argc < 4) { fprintf(stderr, "usage\n"); return 2; }
  std::vector<llama_token> toks;
  for (int i = 2; i < argc; ++i) toks.push_back(atoi(argv[i]));
  llama_backend_init();
  auto mp = llama_model_default_params();
  llama_model * model = llama_model_load_from_file(argv[1], mp);
  if (!model) { fprintf(stderr, "load failed\n"); return 1; }
  auto cp = llama_context_default_params();
  cp.n_ctx = 64; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 1; cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
  llama_context * ctx = llama_init_from_model(model, cp);
  if (!ctx) { fprintf(stderr, "ctx failed\n"); return 1; }
  int n = toks.size();
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0; b.logits[i] = 1;
  }
  b.n_tokens = n;
  if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
  int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (int i = 0; i + 1 < n; ++i) {
    float * l = llama_get_logits_ith(ctx, i);
    double m = l[0];
    for (int v = 1; v < V; ++v) m = l[v] > m ? l[v] : m;
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(l[v] - m);
    printf("%d %.7f %.7f\n", i, l[toks[i + 1]] - m - std::log(s), m);
  }
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
