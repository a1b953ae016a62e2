// Speculative decoding flags and the generate path (spec_options.h).
#include "spec_options.h"

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

SpecRun run_speculative(const SpecOptions& o, const std::shared_ptr<Model>& target, const std::string& device,
                        int threads, int n_ctx, const std::vector<std::vector<int32_t>>& prompts,
                        int n_predict, const std::vector<SamplingParams>& sampling,
                        const std::vector<int32_t>& stop_ids) {
  const SpeculativeParams params = check_spec_options(o);
  const std::string arch = gguf::GgufFile::open(o.draft).get_string("general.architecture");
  const std::string kind = spec_kind(o, arch);
  check(kind != "dflash", "--draft " + o.draft +
                              ": DFlash drafters are not supported by this build yet; use a draft model "
                              "(--spec draft) with the target's vocabulary");
  ModelParams dmp;
  dmp.n_threads = threads;
  dmp.device = device;
  const auto draft = Model::load(o.draft, dmp);
  check(draft->info().n_vocab == target->info().n_vocab,
        "--draft " + o.draft + " has a vocabulary of " + std::to_string(draft->info().n_vocab) +
            " tokens, the model " + std::to_string(target->info().n_vocab) +
            ": a draft model must share the target's vocabulary");
  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.n_seq_max = int32_t(prompts.size());
  Session ts(target, sp), ds(draft, sp);
  DraftModelDrafter drafter(ds, ts.n_vocab());
  SpeculativeDecoder dec(ts, drafter, params);
  SpecRun r;
  const auto t0 = std::chrono::steady_clock::now();
  r.tokens = dec.generate(prompts, n_predict, sampling, stop_ids);
  ts.synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = dec.stats();
  return r;
}

}  // namespace tandem::cli
