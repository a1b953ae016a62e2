// The draft-and-verify loop (speculative.h). Per cycle, for all live sequences at once: the drafter proposes
// up to n tokens after id_last (the last emitted token, not yet decoded by the target); the target decodes
// [id_last, d1 .. dn] in one batch with logits on every row; row k decides d(k+1) (greedy: equal to the
// target's pick; sampled: speculative_accept); the first rejection emits the target's token instead, and a
// fully accepted draft emits a bonus token from row n. The target's cache then keeps history minus its last
// token: the rows of rejected drafts are removed with seq_remove (the drafter trims its own on the next
// call).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "tandem/speculative.h"

namespace tandem {

void SpeculativeParams::validate() const {
  check(draft_max >= 0, "--draft-max must be >= 0, got " + std::to_string(draft_max));
  check(draft_min >= 0, "--draft-min must be >= 0, got " + std::to_string(draft_min));
  check(draft_min <= draft_max, "--draft-min (" + std::to_string(draft_min) +
                                    ") must not exceed --draft-max (" + std::to_string(draft_max) + ")");
  check(draft_p_min >= 0.0f && draft_p_min <= 1.0f,
        "--draft-p-min must be in [0, 1], got " + std::to_string(draft_p_min));
}

double SpeculativeStats::mean_accepted_length() const {
  return cycles == 0 ? 0.0 : double(accepted + cycles) / double(cycles);
}
double SpeculativeStats::acceptance_rate() const {
  return drafted == 0 ? 0.0 : double(accepted) / double(drafted);
}

std::string SpeculativeStats::summary() const {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "speculative: %lld cycles, %lld drafted, %lld accepted (%.1f%%), mean accepted length %.3f",
                (long long)cycles, (long long)drafted, (long long)accepted, 100.0 * acceptance_rate(),
                mean_accepted_length());
  std::string s = buf;
  if (!tried_at.empty()) {
    s += ", per position:";
    for (size_t i = 0; i < tried_at.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %.2f",
                    tried_at[i] ? double(accepted_at[i]) / double(tried_at[i]) : 0.0);
      s += buf;
    }
  }
  return s;
}

SpeculativeDecoder::SpeculativeDecoder(Session& target, Drafter& drafter, const SpeculativeParams& params)
    : target_(target), drafter_(drafter), params_(params) {
  params_.validate();
}

std::vector<std::vector<int32_t>> SpeculativeDecoder::generate(
    const std::vector<std::vector<int32_t>>& prompts, int32_t n_predict,
    std::span<const SamplingParams> sampling, std::span<const int32_t> stop_ids) {
  const size_t n = prompts.size();
  check(sampling.size() == 1 || sampling.size() == n,
        "speculative generate: " + std::to_string(sampling.size()) + " sampling settings for " +
            std::to_string(n) + " prompts (give one, or one per prompt)");
  check(int64_t(n) <= target_.params().n_seq_max,
        "speculative generate: " + std::to_string(n) + " prompts but the target session allows " +
            std::to_string(target_.params().n_seq_max) + " sequences");
  for (size_t i = 0; i < n; ++i)
    check(!prompts[i].empty(), "speculative generate: prompt " + std::to_string(i) + " is empty");
  std::vector<SamplingParams> sp(n);
  std::vector<Sampler> samplers;
  samplers.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    sp[i] = sampling[sampling.size() == 1 ? 0 : i];
    sp[i].validate();
    samplers.emplace_back(sp[i]);
    samplers.back().accept(prompts[i]);  // the prompt counts for the penalties, as in plain generation
  }

  // The drafter may bound a target batch (DFlash: its feature buffer holds that many rows).
  const int32_t max_rows = drafter_.max_target_rows();
  auto decode_target = [&](const Batch& b) {
    target_.decode(b);
    drafter_.target_decoded(b);  // DFlash injects the features of these rows
  };

  // Prefill: the target's cache holds each prompt but its last token (id_last).
  std::vector<std::vector<int32_t>> hist(prompts), out(n);
  Batch batch;
  for (size_t i = 0; i < n; ++i) {
    target_.seq_clear(int32_t(i));
    drafter_.reset(int32_t(i));
    for (size_t j = 0; j + 1 < prompts[i].size(); ++j) {
      batch.add(prompts[i][j], int32_t(j), int32_t(i), false);
      if (max_rows > 0 && int32_t(batch.size()) == max_rows) {
        decode_target(batch);
        batch.clear();
      }
    }
  }
  if (!batch.empty()) decode_target(batch);

  std::vector<uint8_t> done(n, n_predict <= 0 ? 1 : 0);
  const int32_t n_ctx = target_.params().n_ctx;
  std::vector<int32_t> seqs, n_max;
  std::vector<const std::vector<int32_t>*> hptr;
  std::vector<SamplingParams> dsp;
  std::vector<Draft> drafts;
  for (;;) {
    seqs.clear();
    n_max.clear();
    hptr.clear();
    dsp.clear();
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      // The verify rows reach position hist - 1 + n: keep them inside the context; no draft for the last
      // token.
      const int32_t room = n_ctx - int32_t(hist[i].size());
      check(room >= 0, "speculative generate: sequence " + std::to_string(i) + " fills the context (" +
                           std::to_string(n_ctx) + " positions)");
      const int32_t left = n_predict - int32_t(out[i].size()) - 1;
      seqs.push_back(int32_t(i));
      n_max.push_back(std::max(0, std::min({params_.draft_max, left, room})));
      hptr.push_back(&hist[i]);
      dsp.push_back(sp[i]);
    }
    if (seqs.empty()) break;
    const auto t_draft = std::chrono::steady_clock::now();
    drafter_.draft(seqs, hptr, n_max, dsp, params_.draft_p_min, drafts);
    const auto t_verify = std::chrono::steady_clock::now();
    stats_.draft_seconds += std::chrono::duration<double>(t_verify - t_draft).count();

    batch.clear();
    std::vector<size_t> row0(seqs.size());
    for (size_t k = 0; k < seqs.size(); ++k) {
      Draft& d = drafts[k];
      if (int32_t(d.tokens.size()) < params_.draft_min || int32_t(d.tokens.size()) > n_max[k]) d = {};
      const std::vector<int32_t>& h = hist[size_t(seqs[k])];
      row0[k] = batch.size();
      batch.add(h.back(), int32_t(h.size()) - 1, seqs[k], true);
      for (size_t j = 0; j < d.tokens.size(); ++j)
        batch.add(d.tokens[j], int32_t(h.size() + j), seqs[k], true);
    }
    check(max_rows <= 0 || int32_t(batch.size()) <= max_rows,
          "speculative generate: a verify batch of " + std::to_string(batch.size()) + " rows (" +
              std::to_string(seqs.size()) + " sequences x up to draft-max + 1) exceeds the " +
              std::to_string(max_rows) + " rows the drafter reads per target batch (the target's n_batch)");
    decode_target(batch);

    for (size_t k = 0; k < seqs.size(); ++k) {
      const size_t i = size_t(seqs[k]);
      const Draft& d = drafts[k];
      const size_t nd = d.tokens.size();
      Sampler& s = samplers[i];
      ++stats_.cycles;
      stats_.drafted += int64_t(nd);
      if (stats_.tried_at.size() < nd) {
        stats_.tried_at.resize(nd, 0);
        stats_.accepted_at.resize(nd, 0);
      }
      // Each emitted token: counted per draft position, kept in the history; a stop ends the sequence.
      auto keep_token = [&](int32_t token, size_t j, bool ok, std::span<const float>) {
        if (j < nd) {
          ++stats_.tried_at[j];
          if (ok) ++stats_.accepted_at[j];
        }
        s.accept(token);
        hist[i].push_back(token);
        out[i].push_back(token);
        ++stats_.emitted;
        done[i] = int32_t(out[i].size()) >= n_predict ||
                  std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
        return done[i] != 0;
      };
      stats_.accepted += int64_t(verify_draft(target_, row0[k], d, s, keep_token, /*emit_logits=*/false));
      // The target keeps hist minus its last token; rows of rejected drafts go.
      const int32_t keep = int32_t(hist[i].size()) - 1;
      if (!done[i] && keep < target_.seq_len(int32_t(i))) target_.seq_remove(int32_t(i), keep);
    }
    stats_.verify_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_verify).count();
  }
  return out;
}

}  // namespace tandem
