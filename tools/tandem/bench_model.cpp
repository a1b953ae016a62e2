// The model runs of `tandem bench` (bench.h), in the spirit of llama-bench:
//
// pp: one sequence of p prompt tokens per forward pass (logits of the last row only); tokens/s = p / time.
// tg: b sequences decoded together, n steps of one token each from an empty cache, each step ending with the
// next tokens picked on the device (greedy, ids only to the host); tokens/s = b n / time.
// Each test runs once to warm up (CUDA graphs, plans, caches) and then r times, reported as the mean and the
// sample standard deviation of the r runs.
//
// tg's fraction of the bandwidth limit = (bytes of the weights read per step + bytes of K/V read per step) /
// step time / bandwidth, where the weights read per step are all tensors except the token embedding
// (gathered, not read, unless it is also the output matrix) and the K/V read is the average over the run's
// steps. pp's fraction of the matmul rate = (2 x matrix parameters x p for the layers, 2 x n_vocab x n_embd
// for the last row's head, 4 x n_layer x n_head x head_dim x p(p+1)/2 for causal attention) / time / rate.
#include <algorithm>
#include <cstdio>
#include <random>

#include "bench.h"
#include "gguf/gguf.h"
#include "tandem/batch.h"
#include "tandem/session.h"

namespace tandem::cli::bench {
namespace {

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n_vocab, size_t n) {
  std::vector<int32_t> t(n);
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab - 1));
  for (auto& v : t) v = d(rng);
  return t;
}

double run_pp(Session& session, int p, std::mt19937& rng, int64_t n_vocab) {
  session.clear();
  Batch b;
  const auto toks = random_tokens(rng, n_vocab, size_t(p));
  b.add_sequence(toks, 0, 0, true);
  const auto t0 = Clock::now();
  session.decode(b);
  session.synchronize();  // decode only enqueues; the logits stay on the device
  return seconds_since(t0);
}

// With prof, the timed steps (not the depth fill) are the profiler's window, closed into *profile.
double run_tg(Session& session, int n, int n_seq, int depth, std::mt19937& rng, int64_t n_vocab,
              KernelProfiler* prof = nullptr, KernelProfile* profile = nullptr) {
  session.clear();
  Batch b;
  if (depth > 0) {  // untimed: fill each sequence's cache with `depth` positions (the session chunks it)
    for (int s = 0; s < n_seq; ++s) {
      const auto toks = random_tokens(rng, n_vocab, size_t(depth));
      for (int j = 0; j < depth; ++j) b.add(toks[size_t(j)], j, s, j + 1 == depth);
    }
    session.decode(b);
    session.synchronize();
  }
  // A whole generation step: the forward, then each sequence's next token picked on the device (greedy; only
  // the ids come back), as `tandem generate --device-sampling` does. (The tokens fed are random, not the
  // picks, so that every run decodes the same work.)
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<Sampler> samplers(static_cast<size_t>(n_seq), Sampler{greedy});
  std::vector<Sampler*> ptrs;
  std::vector<size_t> rows;
  for (int s = 0; s < n_seq; ++s) {
    ptrs.push_back(&samplers[size_t(s)]);
    rows.push_back(size_t(s));
  }
  if (prof) prof->begin_window();
  const auto t0 = Clock::now();
  for (int step = 0; step < n; ++step) {
    b.clear();
    const auto toks = random_tokens(rng, n_vocab, size_t(n_seq));
    for (int s = 0; s < n_seq; ++s) b.add(toks[size_t(s)], depth + step, s, true);
    session.decode(b);
    (void)session.sample(rows, ptrs);
  }
  const double seconds = seconds_since(t0);
  if (prof) {
    session.synchronize();
    *profile = prof->end_window();
  }
  return seconds;
}

}  // namespace

Stats stats(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

std::string ModelShape::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s: %lld layers, n_embd %lld, heads %lld/%lld x %lld, n_ff %lld, vocab %lld", arch.c_str(),
                (long long)n_layer, (long long)n_embd, (long long)n_head, (long long)n_head_kv,
                (long long)head_dim, (long long)n_ff, (long long)n_vocab);
  return buf;
}

ModelShape read_shape(const std::string& path, const ModelInfo& info) {
  ModelShape s;
  s.arch = info.arch;
  s.name = info.name;
  s.n_layer = info.n_layer;
  s.n_embd = info.n_embd;
  s.n_head = info.n_head;
  s.n_head_kv = info.n_head_kv;
  s.head_dim = info.head_dim;
  s.n_ff = info.n_ff;
  s.n_vocab = info.n_vocab;
  s.n_params = info.n_params;
  s.weight_bytes = info.weight_bytes;
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  const bool tied = f.find_tensor("output.weight") == nullptr;
  // Mixture of experts: a row reads only its expert_used_count experts of each 3-D expert tensor (the
  // "_exps" tensors, {in, out, n_expert}), so a batch-1 decode step reads (and a token multiplies) that
  // share.
  const double n_expert = double(f.get_int(info.arch + ".expert_count", 0));
  const double expert_share =
      n_expert > 0 ? double(f.get_int(info.arch + ".expert_used_count", 0)) / n_expert : 1.0;
  std::string types;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool embd = t.name == "token_embd.weight";
    const bool experts = t.n_dims == 3 && t.name.find("_exps.") != std::string::npos;
    const double share = experts ? expert_share : 1.0;
    if (!embd || tied) s.bytes_per_step += uint64_t(double(t.nbytes) * share);
    if (t.name.rfind("blk.", 0) == 0 && t.n_dims >= 2) {
      s.layer_matrix_params += uint64_t(double(t.nelements()) * share);
      if (types.find(dtype_name(t.type)) == std::string::npos)
        types += std::string(types.empty() ? "" : "+") + dtype_name(t.type);
    }
  }
  s.file_type = types;
  return s;
}

ModelShape qwen3_8b_shape() {
  ModelShape shape;
  shape.arch = "qwen3 (8B shape)";
  shape.n_layer = 36;
  shape.n_embd = 4096;
  shape.n_head = 32;
  shape.n_head_kv = 8;
  shape.head_dim = 128;
  shape.n_ff = 12288;
  shape.n_vocab = 151936;
  return shape;
}

std::vector<Result> bench_model(const std::shared_ptr<Model>& model, const ModelShape& shape,
                                const ModelRuns& runs, const Limits& limits, ProfiledRun* profiled) {
  std::vector<Result> results;
  const std::vector<int>& batches = runs.batches;
  const int max_b = *std::max_element(batches.begin(), batches.end());
  SessionParams sp;
  sp.n_seq_max = std::max(1, max_b);
  sp.n_batch = std::max({runs.n_prompt, max_b, std::min(runs.depth, 512), 1});
  sp.n_ctx = std::max(runs.n_prompt + 16, (runs.depth + runs.n_gen + 16) * max_b) + 64;
  sp.n_logits_max = std::max(1, max_b);
  Session session(model, sp);
  std::mt19937 rng(1234);
  const double kv_elem = sp.kv_type == KvType::F32 ? 4 : 2;
  if (runs.n_prompt > 0) {
    Result r;
    r.test = "pp" + std::to_string(runs.n_prompt);
    r.limit = "matmul";
    run_pp(session, runs.n_prompt, rng, shape.n_vocab);  // warm-up
    for (int i = 0; i < runs.reps; ++i)
      r.tps.push_back(runs.n_prompt / run_pp(session, runs.n_prompt, rng, shape.n_vocab));
    const double p = runs.n_prompt;
    const double flops = 2.0 * double(shape.layer_matrix_params) * p +
                         2.0 * double(shape.n_vocab * shape.n_embd) +
                         4.0 * double(shape.n_layer * shape.n_head * shape.head_dim) * p * (p + 1) / 2;
    r.fraction = flops / (p / stats(r.tps).mean) / limits.rate;
    results.push_back(r);
  }
  if (runs.n_gen > 0) {
    for (int b : batches) {
      Result r;
      r.test = "tg" + std::to_string(runs.n_gen) + (runs.depth > 0 ? " @ d" + std::to_string(runs.depth) : "");
      r.batch = b;
      r.limit = "bw";
      run_tg(session, std::min(runs.n_gen, 8), b, runs.depth, rng, shape.n_vocab);  // warm-up
      for (int i = 0; i < runs.reps; ++i)
        r.tps.push_back(double(b) * runs.n_gen /
                        run_tg(session, runs.n_gen, b, runs.depth, rng, shape.n_vocab));
      const double step_time = double(b) / stats(r.tps).mean;
      const double avg_ctx = runs.depth + (runs.n_gen + 1) / 2.0;
      const double kv_bytes =
          double(b) * double(shape.n_layer * shape.n_head_kv * shape.head_dim * 2) * kv_elem * avg_ctx;
      r.fraction = (double(shape.bytes_per_step) + kv_bytes) / step_time / limits.bw;
      results.push_back(r);
      if (runs.profiler && profiled && b == batches.front()) {
        profiled->what = r.test + ", batch " + std::to_string(b);
        profiled->steps = runs.n_gen;
        profiled->wall_seconds = run_tg(session, runs.n_gen, b, runs.depth, rng, shape.n_vocab, runs.profiler,
                                        &profiled->kernels);
      }
    }
  }
  return results;
}

}  // namespace tandem::cli::bench
