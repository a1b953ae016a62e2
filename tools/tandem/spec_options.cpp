// Speculative decoding flags and the generate path (spec_options.h).
#include "spec_options.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tandem/session.h"

namespace tandem::cli {

void add_spec_options(CLI::App* cmd, SpecOptions* o) {
  cmd->add_option("--draft", o->draft,
                  "Drafter GGUF for speculative decoding (a draft model or a DFlash drafter)");
  cmd->add_option("--spec", o->spec,
                  "Drafter kind: draft or dflash (default: from the drafter's architecture)");
  cmd->add_option("--draft-max", o->draft_max, "Tokens drafted per cycle");
  cmd->add_option("--draft-min", o->draft_min, "A shorter draft is dropped");
  cmd->add_option("--draft-p-min", o->draft_p_min, "Stop drafting before a token less likely than this");
}

SpeculativeParams check_spec_options(const SpecOptions& o) {
  check(o.spec.empty() || o.spec == "draft" || o.spec == "dflash",
        "--spec must be draft or dflash, got '" + o.spec + "'");
  check(o.enabled() || o.spec.empty(), "--spec needs --draft FILE");
  SpeculativeParams p;
  p.draft_max = o.draft_max;
  p.draft_min = o.draft_min;
  p.draft_p_min = o.draft_p_min;
  p.validate();
  return p;
}

std::string spec_kind(const SpecOptions& o, const std::string& draft_arch) {
  const std::string detected = draft_arch == "dflash" ? "dflash" : "draft";
  check(o.spec.empty() || o.spec == detected,
        "--spec " + o.spec + " but " + o.draft + " is a " + draft_arch + " model (" +
            (detected == "dflash" ? "a DFlash drafter" : "a draft model") + ")");
  return detected;
}

namespace {
// Drafts nothing: --draft-max 0 (each cycle is one plain decoding step).
class NoDrafter final : public Drafter {
 public:
  void draft(std::span<const int32_t> seqs, std::span<const std::vector<int32_t>* const>,
             std::span<const int32_t>, std::span<const SamplingParams>, float, std::vector<Draft>& out) override {
    out.assign(seqs.size(), {});
  }
  void reset(int32_t) override {}
};
}  // namespace

SpecRun run_speculative(const SpecOptions& o, const std::shared_ptr<Model>& target, const std::string& device,
                        int threads, int n_ctx, const std::vector<std::vector<int32_t>>& prompts,
                        int n_predict, const std::vector<SamplingParams>& sampling,
                        const std::vector<int32_t>& stop_ids) {
  const SpeculativeParams params = check_spec_options(o);
  const std::string arch = gguf::GgufFile::open(o.draft).get_string("general.architecture");
  const std::string kind = spec_kind(o, arch);
  if (params.draft_max == 0) {  // plain decoding through the same loop (the AR baseline of bench): no drafter
    SessionParams sp;
    sp.n_ctx = n_ctx;
    sp.n_seq_max = int32_t(prompts.size());
    sp.batch_invariant = true;
    Session ts(target, sp);
    NoDrafter none;
    SpeculativeDecoder dec(ts, none, params);
    SpecRun r;
    const auto t0 = std::chrono::steady_clock::now();
    r.tokens = dec.generate(prompts, n_predict, sampling, stop_ids);
    ts.synchronize();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.stats = dec.stats();
    return r;
  }
  ModelParams dmp;
  dmp.n_threads = threads;
  dmp.device = device;
  // A DFlash drafter usually has no token_embd / output of its own: it uses the target's.
  if (kind == "dflash") dmp.share_weights_from = target;
  const auto draft = Model::load(o.draft, dmp);
  if (kind == "draft")
    check(draft->info().n_vocab == target->info().n_vocab,
          "--draft " + o.draft + " has a vocabulary of " + std::to_string(draft->info().n_vocab) +
              " tokens, the model " + std::to_string(target->info().n_vocab) +
              ": a draft model must share the target's vocabulary");
  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.n_seq_max = int32_t(prompts.size());
  // Greedy output must be token-identical to plain decoding: the target's verify rows then run the one-row
  // kernels (SessionParams::batch_invariant). Sampled output is lossless without it.
  SessionParams tsp = sp;
  tsp.batch_invariant = std::all_of(sampling.begin(), sampling.end(), [](const SamplingParams& p) {
    return p.greedy();
  });
  Session ts(target, tsp), ds(draft, sp);
  std::unique_ptr<Drafter> drafter;
  if (kind == "dflash") {
    drafter = std::make_unique<DflashDrafter>(ds, ts);
  } else {
    drafter = std::make_unique<DraftModelDrafter>(ds, ts.n_vocab());
  }
  SpeculativeDecoder dec(ts, *drafter, params);
  SpecRun r;
  const auto t0 = std::chrono::steady_clock::now();
  r.tokens = dec.generate(prompts, n_predict, sampling, stop_ids);
  ts.synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = dec.stats();
  return r;
}

}  // namespace tandem::cli
