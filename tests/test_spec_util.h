// Helpers shared by the speculative-decoding tests (test_spec.cpp, test_dflash.cpp, gpu/test_gpu_dflash.cpp):
// plain greedy decoding as the reference, the target sampler's distribution and a chi-square against it, a
// random DFlash drafter of the shipped model's width, one run of the DFlash loop that also keeps the logits
// of a last draft pass (the device-feature vs host path comparison), and the teacher-forced acceptance of a
// drafter (what models/training/train_dflash.py reports).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "tandem/speculative.h"
#include "test_dflash_fixture.h"
#include "test_greedy.h"

namespace tandem::testing {

// Prompts of the shipped small model's vocabulary (BOS 0 first).
inline const std::vector<std::vector<int32_t>> kSpecPrompts = {
    {0, 417, 1210, 4145}, {0, 306, 258, 1210, 1327}, {0, 893}, {0, 14, 394, 1210, 4145, 306, 258}};

inline SamplingParams greedy_sampling() {
  SamplingParams g;
  g.temperature = 0.0f;
  return g;
}

// Pearson's chi-square of observed counts against expected probabilities; a token outside p's support is an
// outright failure (infinity).
inline double chi_square(const std::map<int32_t, int64_t>& counts, std::span<const TokenCandidate> p,
                         int64_t n) {
  double chi = 0.0, covered = 0.0;
  for (const TokenCandidate& t : p) {
    const double e = double(t.p) * double(n);
    const auto it = counts.find(t.id);
    const double o = it == counts.end() ? 0.0 : double(it->second);
    chi += (o - e) * (o - e) / e;
    covered += o;
  }
  return covered == double(n) ? chi : INFINITY;
}

// The target sampler's distribution (its whole chain) of the token after ctx.
inline std::vector<TokenCandidate> target_distribution(const std::shared_ptr<Model>& model,
                                                       const std::vector<int32_t>& ctx,
                                                       const SamplingParams& sp) {
  Session s(model, {.n_ctx = 64});
  Batch b;
  b.add_sequence(ctx, 0, 0, true);
  s.decode(b);
  Sampler smp(sp);
  smp.accept(ctx);
  smp.sample_with_uniform(s.logits(b.size() - 1), 0.0);
  return {smp.last_candidates().begin(), smp.last_candidates().end()};
}

// A random DFlash drafter of the shipped small model's width (1 layer, taps of layers 1, 4, 7, block 8),
// written to a temporary file; the caller removes it.
inline std::filesystem::path write_shipped_shape_drafter(const std::string& tag) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem_" + tag + "_" + std::to_string(::getpid()) + "_shipped_shape_dflash.gguf");
  write_tiny_dflash(make_tiny_dflash(shipped_shape_dflash_config()), path);
  return path;
}

// Sampled speculative decoding of one prompt, many times: `rounds` generate() calls of n_seq sequences, the
// sequences seeded 1, 2, 3, ... across all rounds; every output (n tokens each unless a sequence stopped).
inline std::vector<std::vector<int32_t>> sampled_outputs(SpeculativeDecoder& spec,
                                                         const std::vector<int32_t>& prompt,
                                                         const SamplingParams& sp, int32_t n_seq,
                                                         int32_t rounds, int n) {
  std::vector<std::vector<int32_t>> all;
  for (int32_t r = 0; r < rounds; ++r) {
    std::vector<SamplingParams> per(size_t(n_seq), sp);
    for (int32_t i = 0; i < n_seq; ++i) per[size_t(i)].seed = uint64_t(r * n_seq + i + 1);
    for (auto& o : spec.generate(std::vector<std::vector<int32_t>>(size_t(n_seq), prompt), n, per))
      all.push_back(std::move(o));
  }
  return all;
}

// Builds the drafter of one run from its session and the target's.
using MakeDrafter = std::function<std::unique_ptr<Drafter>(Session& draft, Session& target)>;

inline MakeDrafter draft_model_drafter() {
  return [](Session& ds, Session& ts) { return std::make_unique<DraftModelDrafter>(ds, ts.n_vocab()); };
}

inline MakeDrafter dflash_drafter(int device_features = -1) {
  return [device_features](Session& ds, Session& ts) {
    return std::make_unique<DflashDrafter>(
        ds, ts, DflashDrafterParams{.device_features = device_features, .log = false});
  };
}

// Greedy speculative decoding of prompts (one sequence each, n_ctx 256) for every draft_max must give the
// expected tokens (plain greedy); every run emits n tokens per prompt and stays within the accepted-length
// bound. Prints and returns each run's stats (the caller checks acceptance).
inline std::vector<SpeculativeStats> expect_greedy_spec_identical(
    const std::shared_ptr<Model>& target, const std::shared_ptr<Model>& draft_model, const MakeDrafter& make,
    const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& expected,
    int n, std::initializer_list<int32_t> draft_maxes, bool batch_invariant, const std::string& label) {
  std::vector<SpeculativeStats> stats;
  const int32_t n_seq = int32_t(prompts.size());
  for (int32_t draft_max : draft_maxes) {
    Session ts(target, {.n_ctx = 256, .n_seq_max = n_seq, .batch_invariant = batch_invariant});
    Session ds(draft_model, {.n_ctx = 256, .n_seq_max = n_seq});
    const std::unique_ptr<Drafter> drafter = make(ds, ts);
    SpeculativeDecoder spec(ts, *drafter, {.draft_max = draft_max});
    const SamplingParams greedy = greedy_sampling();
    const auto out = spec.generate(prompts, n, std::span(&greedy, 1));
    EXPECT_EQ(out.size(), prompts.size());
    for (size_t i = 0; i < out.size() && i < expected.size(); ++i)
      EXPECT_EQ(out[i], expected[i]) << label << ": prompt " << i << ", draft_max " << draft_max;
    const SpeculativeStats& st = spec.stats();
    EXPECT_EQ(st.emitted, int64_t(n) * int64_t(n_seq)) << label;
    EXPECT_LE(st.mean_accepted_length(), double(draft_max) + 1.0) << label;
    std::printf("%s draft_max %d: %s\n", label.c_str(), draft_max, st.summary().c_str());
    stats.push_back(st);
  }
  return stats;
}

// One greedy DFlash run through SpeculativeDecoder with the feature path chosen (device 1, host 0), then one
// more draft pass after sequence 0's text: its block rows' logits. (After generate() the drafter's last
// decode is the feature injection of the final verify batch, which has no logits: the extra pass is what
// gives block rows to compare.)
struct DflashRun {
  std::vector<std::vector<int32_t>> out;
  std::vector<std::vector<float>> block_logits;  // rows 1 .. draft_max of the extra draft pass
  SpeculativeStats stats;
  bool device_features = false;
};

inline DflashRun run_dflash(const std::shared_ptr<Model>& target, const std::shared_ptr<Model>& dm,
                            const std::vector<std::vector<int32_t>>& prompts, int n, int32_t draft_max,
                            int device, bool batch_invariant = false) {
  const int32_t n_seq = int32_t(prompts.size());
  Session ts(target, {.n_ctx = 256, .n_seq_max = n_seq, .batch_invariant = batch_invariant});
  Session ds(dm, {.n_ctx = 256, .n_seq_max = n_seq});
  DflashDrafter drafter(ds, ts, {.device_features = device, .log = false});
  SpeculativeDecoder spec(ts, drafter, {.draft_max = draft_max});
  const SamplingParams greedy = greedy_sampling();
  DflashRun r;
  r.device_features = drafter.device_features();
  r.out = spec.generate(prompts, n, std::span(&greedy, 1));
  r.stats = spec.stats();
  std::vector<int32_t> hist = prompts[0];
  hist.insert(hist.end(), r.out[0].begin(), r.out[0].end());
  const std::vector<int32_t>* h = &hist;
  const int32_t seq = 0;
  std::vector<Draft> d;
  drafter.draft(std::span(&seq, 1), std::span(&h, 1), std::span(&draft_max, 1), std::span(&greedy, 1), 0.0f,
                d);
  for (int32_t j = 1; j <= draft_max; ++j) {
    const auto l = ds.logits(size_t(j));
    r.block_logits.emplace_back(l.begin(), l.end());
  }
  return r;
}

// Teacher-forced acceptance of a DFlash drafter, the figure train_dflash.py reports: the target decodes the
// prompt and its greedy continuation once (the drafter injects the features of every position); then for
// each anchor a (last to first, since draft() trims the drafter's cache to its anchor) the drafter drafts
// [token a, mask x n] over the context < a, and slot j counts when slots 1 .. j equal the true tokens a + 1
// .. a + j. Separates the drafter's forward (and its features) from the draft / verify loop.
struct TeacherForced {
  std::vector<double> per_slot;  // P(slots 1 .. j all right)
  double mean_accepted_length = 0;
  int64_t blocks = 0;
};

inline TeacherForced teacher_forced(const std::shared_ptr<Model>& target, const std::shared_ptr<Model>& dm,
                                    const std::vector<int32_t>& prompt, int n_gen, int32_t n) {
  std::vector<int32_t> seq = prompt;
  const auto cont = plain_greedy(target, prompt, n_gen);
  seq.insert(seq.end(), cont.begin(), cont.end());
  Session ts(target, {.n_ctx = 512}), ds(dm, {.n_ctx = 512});
  DflashDrafter drafter(ds, ts, {.log = false});
  Batch tb;
  tb.add_sequence(seq, 0, 0, false);
  ts.decode(tb);
  drafter.target_decoded(tb);
  TeacherForced r;
  r.per_slot.assign(size_t(n), 0.0);
  const SamplingParams greedy = greedy_sampling();
  int64_t run_sum = 0;
  for (int32_t a = int32_t(seq.size()) - 1 - n; a >= int32_t(prompt.size()) - 1; --a) {
    const std::vector<int32_t> hist(seq.begin(), seq.begin() + a + 1);
    const std::vector<int32_t>* h = &hist;
    const int32_t sq = 0;
    std::vector<Draft> out;
    drafter.draft(std::span(&sq, 1), std::span(&h, 1), std::span(&n, 1), std::span(&greedy, 1), 0.0f, out);
    int32_t run = 0;
    while (run < n && out[0].tokens[size_t(run)] == seq[size_t(a + 1 + run)]) ++run;
    for (int32_t j = 0; j < run; ++j) r.per_slot[size_t(j)] += 1.0;
    run_sum += run;
    ++r.blocks;
  }
  const double blocks = double(std::max<int64_t>(r.blocks, 1));
  for (double& v : r.per_slot) v /= blocks;
  r.mean_accepted_length = 1.0 + double(run_sum) / blocks;
  return r;
}

}  // namespace tandem::testing
