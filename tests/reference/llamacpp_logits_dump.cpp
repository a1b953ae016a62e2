// Interop probe (issue 16): runs a GGUF through a built llama.cpp (its public C API, libllama) and prints the
// logits of every prompt row and a greedy continuation as JSON, so tests/reference/llamacpp_runs_fixtures.py
// can compare them with transformers' numbers in tests/data/models/*.json. Not part of tandem's build: that
// script compiles it against a llama.cpp you built (LLAMA_CPP_SRC headers, LLAMA_CPP_BIN/libllama.so).
//
// usage: llamacpp_logits_dump MODEL.gguf N_GREEDY ID ID ID ...   (CPU, f32 K/V cache, flash attention off)
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

void print_row(const float* row, int n_vocab) {
  std::printf("[");
  for (int j = 0; j < n_vocab; ++j) std::printf(j ? ",%.9g" : "%.9g", row[j]);
  std::printf("]");
}

int argmax(const float* row, int n_vocab) {
  int best = 0;
  for (int j = 1; j < n_vocab; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_GREEDY ID [ID...]\n", argv[0]);
    return 2;
  }
  const int n_greedy = std::atoi(argv[2]);
  std::vector<llama_token> prompt;
  for (int i = 3; i < argc; ++i) prompt.push_back(std::atoi(argv[i]));

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama.cpp could not make a context\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  // The prompt in one batch, logits for every row.
  llama_batch batch = llama_batch_init(static_cast<int>(prompt.size()), 0, 1);
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.token[i] = prompt[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int>(prompt.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed on the prompt\n");
    return 1;
  }
  std::printf("{\"n_vocab\":%d,\"logits\":[", n_vocab);
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i) std::printf(",");
    print_row(llama_get_logits_ith(ctx, static_cast<int>(i)), n_vocab);
  }
  std::printf("],\"greedy\":[");
  int next = argmax(llama_get_logits_ith(ctx, static_cast<int>(prompt.size()) - 1), n_vocab);
  for (int s = 0; s < n_greedy; ++s) {
    std::printf(s ? ",%d" : "%d", next);
    if (s + 1 == n_greedy) break;
    llama_batch one = llama_batch_get_one(&next, 1);
    if (llama_decode(ctx, one) != 0) {
      std::fprintf(stderr, "llama_decode failed at greedy step %d\n", s);
      return 1;
    }
    next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
  }
  std::printf("]}\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
