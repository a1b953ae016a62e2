// `tandem generate -m MODEL.gguf (-p PROMPT | --prompt-ids 1,2,3) [-n N] [sampling flags] [--ctx N]
// [--threads N] [--parallel N] [--ids] [--devices LIST --split-mode MODE ...]`: autoregressive generation.
// The split flags (split_options.h) run one model over several devices.
//
// One sequence streams its text to stdout as it is produced. --parallel N decodes N sequences of the same
// prompt in one batch per step: the prompt is prefilled once in sequence 0 and forked into the others (the KV
// blocks are shared, not copied); sequence i samples with seed + i. --prompt-ids may hold several prompts
// separated by ';' (one sequence each, prefilled together in one batch). --ids prints the generated ids,
// space-separated, one line per sequence. --stop STR (repeatable) ends a sequence when its text contains STR;
// the text printed ends before it (--ids: the ids up to the token that completed it). Prompt and generation
// speed go to stderr at the end. The loop itself is the library's tandem::Generator (tandem/generator.h).
//
// A canvas diffusion model (tandem::canvas_model_info succeeds) is routed to `tandem diffuse`'s run
// (diffuse_options.h): -p / --prompt-ids, -n, --seed, --ids and the --diffusion-* flags apply.
//
// Hidden (for tests and the transformers parity script): --dump-logits FILE writes the logits of every prompt
// row and of every decoded row as binary records: the header "TLOG" + uint32 n_vocab, then per row int32
// sequence, int32 position, n_vocab float32 (little-endian).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "diffuse_options.h"
#include "flag_checks.h"
#include "parallel/process_world.h"
#include "run_options.h"
#include "spec_options.h"
#include "split_options.h"
#include "tandem/generator.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int n_predict = 128;
  SamplingFlags sampling;
  int ctx = 4096;
  int threads = 0;
  int parallel = 1;
  int batch = 512;
  std::string kv_type = "f16";
  bool ids = false;
  bool ignore_eos = false;
  bool device_sampling = false;
  bool no_bos = false;
  SpecOptions spec;  // --draft and friends (spec_options.h)
  bool verbose = false;
  std::vector<std::string> stop;
  std::string dump_logits;
  SplitOptions split;
  DiffuseOptions diffusion;  // the --diffusion-* flags, for canvas models (routed to run_diffusion)
};

// "1,2,3;4,5" -> {{1, 2, 3}, {4, 5}}
std::vector<std::vector<int32_t>> parse_prompt_ids(const std::string& s) {
  std::vector<std::vector<int32_t>> prompts(1);
  std::string num;
  auto flush = [&]() {
    if (num.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == num.size() && v >= INT32_MIN && v <= INT32_MAX,
          "--prompt-ids: '" + num + "' is not a token id (expected comma-separated integers)");
    prompts.back().push_back(int32_t(v));
    num.clear();
  };
  char prev = ';';
  for (char c : s) {
    // "1,,3": an empty entry between two commas is a typo, not an id to skip.
    check(!(c == ',' && (prev == ',' || prev == ';')), "--prompt-ids: empty entry in '" + s + "'");
    if (c != ' ') prev = c;
    if (c == ',' || c == ' ') {
      flush();
    } else if (c == ';') {
      flush();
      prompts.emplace_back();
    } else {
      num += c;
    }
  }
  flush();
  for (const auto& p : prompts) check(!p.empty(), "--prompt-ids: empty prompt in '" + s + "'");
  return prompts;
}

class LogitsDump {
 public:
  LogitsDump(const std::string& path, int64_t n_vocab) : out_(path, std::ios::binary) {
    check(static_cast<bool>(out_), "cannot write " + path);
    out_.write("TLOG", 4);
    const uint32_t n = uint32_t(n_vocab);
    out_.write(reinterpret_cast<const char*>(&n), 4);
  }
  void row(int32_t seq, int32_t pos, std::span<const float> logits) {
    out_.write(reinterpret_cast<const char*>(&seq), 4);
    out_.write(reinterpret_cast<const char*>(&pos), 4);
    out_.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
    check(static_cast<bool>(out_), "writing the logits dump failed");
  }

 private:
  std::ofstream out_;
};

// --draft: the speculative loop (one sequence per prompt; a shared prompt is repeated), then the same output
// as the plain path, and the acceptance statistics on stderr.
void run_spec_generate(const GenerateArgs& a, const std::shared_ptr<Model>& model, const std::string& device,
                       std::vector<std::vector<int32_t>> prompts, int n_seq, const SamplingParams& base,
                       const tokenizer::Tokenizer* tok) {
  if (prompts.size() == 1) prompts.assign(size_t(n_seq), prompts[0]);
  std::vector<SamplingParams> sampling(size_t(n_seq), base);
  for (int i = 0; i < n_seq; ++i) sampling[size_t(i)].seed = base.seed + uint64_t(i);
  std::vector<int32_t> stop_ids;
  if (!a.ignore_eos) stop_ids = model->info().eos_ids;
  const SpecRun r =
      run_speculative(a.spec, model, device, a.threads, a.ctx, prompts, a.n_predict, sampling, stop_ids);
  size_t n_generated = 0;
  for (int i = 0; i < n_seq; ++i) {
    std::vector<int32_t> g = r.tokens[size_t(i)];
    // As the plain path prints it: the end-of-generation token that stopped a sequence is not shown.
    if (!g.empty() && std::find(stop_ids.begin(), stop_ids.end(), g.back()) != stop_ids.end()) g.pop_back();
    n_generated += g.size();
    if (a.ids) {
      std::string line;
      for (size_t j = 0; j < g.size(); ++j) line += (j ? " " : "") + std::to_string(g[j]);
      std::printf("%s\n", line.c_str());
    } else if (n_seq == 1) {
      std::printf("%s\n", tok->decode(g).c_str());
    } else {
      std::printf("=== sequence %d (seed %llu) ===\n%s\n", i, (unsigned long long)sampling[size_t(i)].seed,
                  tok->decode(g).c_str());
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr, "generation: %zu tokens in %d sequence%s in %.3f s (%.2f tokens/s, speculative, %s)\n",
               n_generated, n_seq, n_seq == 1 ? "" : "s", r.seconds,
               r.seconds > 0 ? double(n_generated) / r.seconds : 0.0,
               base.greedy() ? "greedy" : ("seed " + std::to_string(base.seed)).c_str());
  std::fprintf(stderr, "%s\n", r.stats.summary().c_str());
}

void run_generate(const GenerateArgs& a) {
  check(a.n_predict >= 0,
        "-n must be >= 0 (the number of tokens to generate), got " + std::to_string(a.n_predict));
  check(a.parallel >= 1, "--parallel must be at least 1, got " + std::to_string(a.parallel));
  check_run_flags(a.ctx, a.batch, a.threads);
  check_sampling_flags(a.sampling);
  check(a.prompt.empty() != a.prompt_ids.empty(),
        "give the prompt either as text (-p) or as ids (--prompt-ids)");
  for (const std::string& s : a.stop) check(!s.empty(), "--stop: the stop string is empty");
  check_spec_options(a.spec);
  check(!a.spec.enabled() || (a.stop.empty() && a.dump_logits.empty() && !a.device_sampling),
        "--draft does not combine with --stop, --dump-logits or --device-sampling");
  check_diffusion_options(a.diffusion);

  {
    ModelParams check_only;
    apply(a.split, check_only);  // bad split flags fail here, before any file is read
  }
  // No -m: the small model shipped in models/ (models/README.md).
  const std::string model_path = model_path_or_default(a.model);
  // The one file generate writes must not be one it reads.
  check(a.dump_logits.empty() || !same_file(a.dump_logits, model_path),
        "--dump-logits '" + a.dump_logits + "' is the model file (-m); write the logits to a different path");
  const LoadedModel loaded = load_model(model_path, a.threads, a.split);
  const auto& model = loaded.model;
  const MeshSpec& mesh = loaded.mesh;
  // A canvas diffusion model generates whole canvases with the EB sampler: `tandem diffuse`'s run.
  if (is_canvas_model(*model)) {
    check(!a.spec.enabled() && a.stop.empty() && a.dump_logits.empty() && a.parallel == 1,
          "'" + model_path +
              "' is a canvas diffusion model: --draft, --stop, --dump-logits and --parallel do not "
              "apply to it (see tandem diffuse --help)");
    DiffuseOptions d = a.diffusion;
    d.prompt = a.prompt;
    d.prompt_ids = a.prompt_ids;
    d.n_predict = a.n_predict;
    d.seed = a.sampling.seed;
    d.ids = a.ids;
    return run_diffusion(d, model, model_path);
  }
  const ModelInfo& info = model->info();
  if (a.verbose)
    std::fprintf(stderr, "model: %s %s, %lld layers, n_embd %lld, vocab %lld, %.1f M params, on %s\n",
                 info.arch.c_str(), info.name.empty() ? "" : ("'" + info.name + "'").c_str(),
                 (long long)info.n_layer, (long long)info.n_embd, (long long)info.n_vocab,
                 double(info.n_params) / 1e6, info.device.c_str());
  if (a.verbose && mesh.n_ranks() > 1) std::fprintf(stderr, "split: %s\n", mesh.describe().c_str());

  // The tokenizer is needed for a text prompt, for text output and for stop strings. Without it (--ids and
  // --prompt-ids), the generator works on ids alone and ends generation at the file's EOS ids.
  const bool use_tokenizer = !a.prompt.empty() || !a.ids || !a.stop.empty();
  const tokenizer::Tokenizer* tok = nullptr;
  if (use_tokenizer) {
    try {
      tok = &model->tokenizer();
    } catch (const Error& e) {
      throw Error(
          std::string("this model's tokenizer cannot be used (") + e.what() +
          (a.stop.empty() ? "); give --prompt-ids and --ids to work with token ids" : "); --stop needs it"));
    }
  }

  std::vector<std::vector<int32_t>> prompts;
  if (!a.prompt_ids.empty()) {
    prompts = parse_prompt_ids(a.prompt_ids);
  } else {
    prompts.push_back(tok->encode(a.prompt, /*add_special=*/!a.no_bos, /*parse_special=*/true));
    check(!prompts[0].empty(), "the prompt is empty after tokenization");
  }
  const bool shared_prompt = prompts.size() == 1;
  check(shared_prompt || a.parallel == 1 || a.parallel == int(prompts.size()),
        "--parallel " + std::to_string(a.parallel) + " does not match the " + std::to_string(prompts.size()) +
            " prompts of --prompt-ids");
  const int n_seq = shared_prompt ? a.parallel : int(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    check(int64_t(prompts[i].size()) <= a.ctx, "the prompt has " + std::to_string(prompts[i].size()) +
                                                   " tokens but the context holds " + std::to_string(a.ctx) +
                                                   " (--ctx)");

  SessionParams sp;
  sp.n_ctx = a.ctx;
  sp.n_seq_max = n_seq;
  sp.n_batch = a.batch;
  sp.kv_type = *parse_kv_type_flag(a.kv_type, "--kv-type", /*allow_auto=*/false);
  Session session(model, sp);
  std::unique_ptr<LogitsDump> dump;
  if (!a.dump_logits.empty()) dump = std::make_unique<LogitsDump>(a.dump_logits, info.n_vocab);

  GenerationParams gp;
  gp.max_tokens = a.n_predict;
  gp.ignore_eos = a.ignore_eos;
  gp.stop = a.stop;
  gp.sampling = sampling_params(a.sampling);
  const SamplingParams& base = gp.sampling;
  const uint64_t seed = base.seed;  // sequence i: seed + i
  if (a.spec.enabled()) {
    run_spec_generate(a, model, mesh.devices[size_t(mesh.main_device)].to_string(), prompts, n_seq, base,
                      tok);
    return;
  }

  GeneratorParams genp;
  genp.device_sampling = a.device_sampling;
  genp.use_tokenizer = use_tokenizer;
  if (dump) {
    genp.all_prompt_logits = true;
    genp.on_logits = [&dump](std::span<const LogitsRow> rows) {
      for (const LogitsRow& r : rows) dump->row(r.seq, r.pos, r.logits);
    };
  }
  Generator gen(session, genp);
  // One sequence of text streams to stdout as it is produced.
  const bool stream_text = !a.ids && n_seq == 1;
  StreamCallback on_token;
  // (Not flushed per token under mpirun: its forwarding loses pieces of a line, main.cpp.)
  const bool flush_tokens = launcher_world().size <= 1;
  if (stream_text)
    on_token = [flush_tokens](const TokenEvent& e) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      if (e.token >= 0 && flush_tokens) std::fflush(stdout);
    };
  // A shared prompt is prefilled once in sequence 0 and forked; several prompts are prefilled in one batch.
  std::vector<int> ids;
  if (shared_prompt) {
    ids = gen.add_shared_prompt_requests(prompts[0], n_seq, gp, on_token);
  } else {
    for (int i = 0; i < n_seq; ++i) {
      GenerationParams p = gp;
      p.sampling.seed = seed + uint64_t(i);
      ids.push_back(gen.add_request(prompts[size_t(i)], p, on_token));
    }
  }
  gen.run();

  size_t n_prompt_tokens = 0, n_generated = 0;
  for (const auto& p : prompts) n_prompt_tokens += p.size();
  double prompt_s = 0, gen_s = 0;  // every prompt is decoded in the first step; generation starts after it
  for (int id : ids) {
    const GenerationResult& r = gen.result(id);
    n_generated += r.tokens.size();
    prompt_s = std::max(prompt_s, r.prompt_seconds);
    gen_s = std::max(gen_s, r.generation_seconds);
  }

  if (stream_text) {
    std::fputc('\n', stdout);
  } else if (a.ids) {
    for (int id : ids) {
      const std::vector<int32_t>& g = gen.result(id).tokens;
      std::string line;
      for (size_t j = 0; j < g.size(); ++j) line += (j ? " " : "") + std::to_string(g[j]);
      std::printf("%s\n", line.c_str());
    }
  } else {
    for (int i = 0; i < n_seq; ++i) {
      const GenerationResult& r = gen.result(ids[size_t(i)]);
      // Without stop strings, the text of the whole id sequence as the tokenizer decodes it (a SentencePiece
      // prefix space removed); with them, the text up to the stop string.
      const std::string text = a.stop.empty() ? tok->decode(r.tokens) : r.text;
      std::printf("=== sequence %d (seed %llu) ===\n%s\n", i, (unsigned long long)(seed + uint64_t(i)),
                  text.c_str());
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.2f tokens/s)\n", n_prompt_tokens, prompt_s,
               prompt_s > 0 ? double(n_prompt_tokens) / prompt_s : 0.0);
  const std::string seed_note = base.greedy() ? "greedy" : "seed " + std::to_string(seed);
  std::fprintf(stderr, "generation: %zu tokens in %d sequence%s in %.3f s (%.2f tokens/s, %s)\n", n_generated,
               n_seq, n_seq == 1 ? "" : "s", gen_s, gen_s > 0 ? double(n_generated) / gen_s : 0.0,
               seed_note.c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a model (autoregressive, CPU)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides
  cmd->add_option("-m,--model", args->model,
                  "Model file (GGUF); default: the shipped models/tandem-small-q8_0.gguf");
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", args->prompt_ids,
                  "Prompt as token ids, comma-separated; several prompts separated by ';' run as one batch");
  cmd->add_option("-n,--n-predict", args->n_predict, "Tokens to generate per sequence");
  add_sampling_flags(cmd, &args->sampling, "Random seed (-1: random); sequence i uses seed + i");
  cmd->add_option("-c,--ctx", args->ctx, "KV cache size in positions, shared by all sequences");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all cores)");
  cmd->add_option("--parallel", args->parallel, "Sequences decoded together from the same prompt");
  cmd->add_option("-b,--batch", args->batch, "Rows per forward pass during prompt processing");
  cmd->add_option("--kv-type", args->kv_type, "KV cache type: f32, f16 or bf16");
  cmd->add_option(
         "--stop", args->stop,
         "Stop string (repeatable): a sequence ends when its text contains one; the text ends before it")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);  // one string per --stop
  add_split_options(cmd, &args->split);
  add_spec_options(cmd, &args->spec);
  add_diffusion_options(cmd, &args->diffusion);
  cmd->add_flag("--ids", args->ids, "Print generated token ids (one line per sequence) instead of text");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at end-of-generation tokens");
  cmd->add_flag(
      "--device-sampling", args->device_sampling,
      "Sample on the model's output device (only the ids cross to the host; penalties sample on the host)");
  cmd->add_flag("--no-bos", args->no_bos, "Do not add the BOS token to a text prompt");
  cmd->add_flag("-v,--verbose", args->verbose, "Describe the model on stderr before generating");
  cmd->add_option("--dump-logits", args->dump_logits, "Write every computed row of logits to FILE (tests)")
      ->group("");  // hidden
  cmd->callback([args] {
    if (parse_only()) return;
    run_generate(*args);
  });
}

}  // namespace tandem::cli
