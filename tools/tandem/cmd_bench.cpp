// `tandem bench`: speed of a model in the spirit of llama-bench, with every figure set against the hardware
// limit it should approach.
//
//   tandem bench -m MODEL [-p 512] [-n 128] [-b 1,8,32] [-r 5] [-o md|json] [--bw GB/s] [--tflops T]
//                [--device cuda:0|cpu
//                 | --devices LIST --split-mode MODE [--tensor-split R,..] [--main-device N]]
//                [--kernels] [--profile]
//   tandem bench -m MODEL --random-weights TYPE --to OUT.gguf [-t N]
//   tandem bench -m CANVAS_MODEL --diffusion [-p 128] [--diffusion-steps S] [-r 3]   (bench_diffusion.cpp)
//
// This file is the command: its flags, their checks and the order of the runs. The parts are declared in
// bench.h: the limits (bench_limits.cpp: measured copy bandwidth and matmul rate), the pp and tg tests and
// their fractions of the limits (bench_model.cpp), --kernels (bench_kernels.cpp), the report
// (bench_report.cpp) and --random-weights (bench_random_weights.cpp).
//
// With --devices and a split mode (split_options.h) the model runs over the mesh; the report names the mode
// and the devices. The limits are measured on the main device (bench_limits.cpp: how a split scales them).
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_diffusion.h"
#include "bench_spec.h"
#include "commands.h"
#include "diffuse_options.h"
#include "core/error.h"
#include "flag_checks.h"
#include "split_options.h"

namespace tandem::cli {
namespace {

struct BenchArgs {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;
  std::string batches = "1,8,32";
  int reps = 5;
  std::string output = "md";
  double bw_gbs = 0;   // 0 = measure
  double tflops = 0;   // 0 = default / measure
  std::string device;  // "" = cuda:0 when present, else cpu
  bool kernels = false;
  std::string kernels_only;  // --kernels-only: one group of kernels (matmul, swiglu or attention)
  int threads = 0;
  std::string random_type;  // --random-weights: write -m's model with random TYPE matrices to --to, then exit
  std::string random_to;
  SplitOptions split;
  SpecOptions spec;        // --draft: speculative vs AR (bench_spec.h)
  bool diffusion = false;  // --diffusion: canvas diffusion, host vs device sampling (bench_diffusion.h)
  int diffusion_steps = 0;
  std::string diffusion_kv_type = "auto";
  bool profile = false;  // --profile: per-kernel times of the tg steps (or denoising steps), CUPTI
};

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    check(!item.empty() && end && *end == '\0' && v > 0 && v < (1 << 20),
          std::string(what) + ": expected a comma-separated list of positive integers, got '" + s + "'");
    out.push_back(int(v));
  }
  check(!out.empty(), std::string(what) + ": empty list");
  return out;
}

DeviceId parse_device(const std::string& s) {
  if (s.empty()) return device_count(DeviceKind::CUDA) > 0 ? DeviceId{DeviceKind::CUDA, 0} : DeviceId{};
  return parse_device_id(s, "--device");
}

void run_bench(const BenchArgs& a) {
  if (!a.random_type.empty()) {
    check(!a.model.empty(), "--random-weights needs the model to copy with -m");
    return bench::write_random_weights(a.model, a.random_type, a.random_to, a.threads);
  }
  check(a.output == "md" || a.output == "json", "-o: expected md or json, got '" + a.output + "'");
  check_int_flag("-r", a.reps, 1, 1000000, "timed repetitions");
  check_int_flag("-p", a.n_prompt, 0, 1 << 24, "prompt tokens; 0 = skip pp");
  check_int_flag("-n", a.n_gen, 0, 1 << 24, "generated tokens; 0 = skip tg");
  check_int_flag("-d", a.depth, 0, 1 << 24, "context depth of the tg tests");
  check_real_flag("--bw", a.bw_gbs, 0, "GB/s; 0 = measure");
  check_real_flag("--tflops", a.tflops, 0, "TFLOP/s; 0 = default");
  check_threads_flag(a.threads, "-t");
  const std::vector<int> batches = parse_int_list(a.batches, "-b");
  check_spec_options(a.spec);
  check(!a.spec.enabled() || !a.model.empty(), "--draft needs the target model with -m");
  check(!a.spec.enabled() || a.output == "md", "--draft reports in markdown only (-o md)");
  check(a.device.empty() || a.split.devices.empty(),
        "--device and --devices: give one of them (--devices lists every device of the mesh, "
        "--main-device picks the main one)");
  check_int_flag("--diffusion-steps", a.diffusion_steps, 0, 100000, "0 = the model's default");
  check(!a.diffusion || !a.model.empty(), "--diffusion needs the canvas model with -m");
  check(!a.diffusion || !a.spec.enabled(), "--diffusion and --draft: give one of them");
  ModelParams mp;
  mp.n_threads = a.threads;
  mp.device = parse_device(a.device).to_string();
  const MeshSpec mesh = apply(a.split, mp);
  // --profile records from before the model loads: the steps' CUDA graphs are then made while it records.
  std::unique_ptr<KernelProfiler> profiler;
  if (a.profile) {
    const DeviceId main_dev = mesh.devices[size_t(mesh.main_device)];
    check(main_dev.kind == DeviceKind::CUDA,
          "bench --profile: records the kernels of a GPU; the device is " + main_dev.to_string());
    check(a.diffusion || (!a.model.empty() && a.n_gen > 0),
          "bench --profile: profiles the tg steps of -m (needs -n > 0) or the denoising steps of --diffusion");
    std::string why;
    profiler = KernelProfiler::start(&why);
    check(profiler != nullptr, "bench --profile: cannot record kernels: " + why);
  }
  if (a.diffusion) {
    const auto model = Model::load(a.model, mp);
    return bench_diffusion(model, a.model, a.n_prompt, a.diffusion_steps, parse_diffusion_kv_type(a.diffusion_kv_type),
                           a.reps, a.bw_gbs, profiler.get());
  }
  // The limits are measured on the main device, where the mode none runs and the logits land.
  const DeviceId dev_id = mesh.devices[size_t(mesh.main_device)];
  check(a.kernels || !a.model.empty(),
        "tandem bench: give a model with -m (or --kernels to time kernels alone)");

  DeviceOptions dopt;
  dopt.n_threads = a.threads;
  std::unique_ptr<Device> dev = create_device(dev_id, dopt);
  bench::Report report;
  report.device = dev->name();
  report.model_path = a.model;
  report.mesh = mesh;
  report.limits = bench::hardware_limits(*dev, mesh, a.bw_gbs, a.tflops);

  std::shared_ptr<Model> model;
  if (!a.model.empty()) {
    model = Model::load(a.model, mp);
    report.shape = bench::read_shape(a.model, model->info());
  } else {
    report.shape = bench::qwen3_8b_shape();
  }
  // What the model reports it runs on (else the mesh as parsed: no model, or the loader leaves it out).
  report.split_mode = split_mode_name(mesh.mode);
  for (const DeviceId& d : mesh.devices) report.devices.push_back(d.to_string());
  if (model && !model->info().split_mode.empty()) report.split_mode = model->info().split_mode;
  if (model && !model->info().devices.empty()) report.devices = model->info().devices;

  if (model) {
    bench::ModelRuns runs;
    runs.n_prompt = a.n_prompt;
    runs.n_gen = a.n_gen;
    runs.depth = a.depth;
    runs.batches = batches;
    runs.reps = a.reps;
    runs.profiler = profiler.get();
    bench::ProfiledRun profiled;
    report.results = bench::bench_model(model, report.shape, runs, report.limits, &profiled);
    if (profiler) report.profiles.push_back(std::move(profiled));
  }
  report.kernels = a.kernels;
  if (a.kernels) report.kernel_results = bench::bench_kernels(*dev, report.shape, a.kernels_only);

  if (a.output == "json")
    bench::print_json(report);
  else
    bench::print_markdown(report);
  if (a.spec.enabled()) bench_speculative(a.spec, model, mp.device, a.threads, std::max(a.n_gen, 1), a.reps);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Measure prompt processing and generation speed against hardware limits");
  cmd->add_option("-m,--model", args->model, "GGUF model file");
  cmd->add_option("-p,--n-prompt", args->n_prompt, "prompt tokens of the pp test (0 = skip)");
  cmd->add_option("-n,--n-gen", args->n_gen, "generated tokens per sequence of the tg tests (0 = skip)");
  cmd->add_option("-d,--depth", args->depth,
                  "tg: positions already in each sequence's cache before the timed steps (as llama-bench -d)");
  cmd->add_option("-b,--batch", args->batches, "comma-separated numbers of parallel sequences for tg");
  cmd->add_option("-r,--repetitions", args->reps, "timed repetitions of each test");
  cmd->add_option("-o,--output", args->output, "output format: md or json");
  cmd->add_option("--bw", args->bw_gbs, "device copy bandwidth in GB/s (0 = measure)");
  cmd->add_option("--tflops", args->tflops, "matmul rate in TFLOP/s for pp's fraction (0 = default)");
  cmd->add_option("--device", args->device,
                  "cuda:N or cpu (default: cuda:0 when present); see --devices to split");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0 = all)");
  cmd->add_flag("--kernels", args->kernels,
                "also time the kernels alone on the model's shapes (on the main device)");
  cmd->add_option("--kernels-only", args->kernels_only,
                  "time only this group of kernels (implies --kernels): matmul, swiglu or attention")
      ->check(CLI::IsMember({"matmul", "swiglu", "attention"}));
  add_split_options(cmd, &args->split);
  cmd->add_option(
      "--random-weights", args->random_type,
      "instead of benchmarking: write a copy of -m whose matrices are random values of this type "
      "(q8_0, q4_k, ...) to --to (benchmark models in seconds; speed does not depend on the values)");
  add_spec_options(cmd, &args->spec);
  cmd->add_option("--to", args->random_to, "output file of --random-weights");
  cmd->add_flag(
      "--diffusion", args->diffusion,
      "canvas diffusion model: PREFILL ms, ms per denoising step and tokens/s, host vs device sampling "
      "(-p prompt tokens, -r repetitions)");
  cmd->add_flag("--profile", args->profile,
                "per-kernel GPU time of the tg steps (first batch; or of the denoising steps with --diffusion), "
                "with the idle time between kernels (needs CUPTI, from the CUDA toolkit)");
  cmd->add_option("--diffusion-kv-type", args->diffusion_kv_type,
                  "with --diffusion: the K/V store's precision, auto|f32|f16|bf16 (as tandem diffuse)");
  cmd->add_option("--diffusion-steps", args->diffusion_steps,
                  "with --diffusion: denoising steps per block (0: the model's default)");
  cmd->callback([args] {
    if (!args->kernels_only.empty()) args->kernels = true;
    if (parse_only()) return;
    run_bench(*args);
  });
}

}  // namespace tandem::cli
