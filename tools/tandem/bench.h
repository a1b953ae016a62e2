// Internals of `tandem bench` (cmd_bench.cpp), shared by its parts:
//   cmd_bench.cpp             the command: flags, argument checks, the mesh and device, the order of the runs
//   bench_limits.cpp          the hardware limits every figure is set against (copy bandwidth, matmul rate)
//   bench_model.cpp           the model's shape and its pp / tg throughput runs
//   bench_kernels.cpp         --kernels: the kernels alone on the model's shapes
//   bench_report.cpp          the report, as markdown or JSON
//   bench_random_weights.cpp  --random-weights: random-valued copies of a model, for benchmarks
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kernel_profile.h"
#include "parallel/mesh.h"
#include "tandem/model.h"

namespace tandem::cli::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Mean and sample standard deviation.
struct Stats {
  double mean = 0, sd = 0;
};
Stats stats(const std::vector<double>& v);

// ---- hardware limits (bench_limits.cpp) -------------------------------------------------------------------

struct Limits {
  double bw = 0;            // copy bandwidth in bytes/s (read + written), times limit_devices
  double rate = 0;          // matmul rate in FLOP/s, times limit_devices
  int limit_devices = 1;    // distinct GPUs working at the same time (1 unless a tensor or row split on GPUs)
  bool bw_given = false;    // --bw, else measured
  std::string rate_source;  // "given", "H200 bf16, issue 5" or "measured f32 matmul"
};

// The limits on dev, the main device of mesh: bw_gbs (GB/s) and tflops (TFLOP/s) when > 0, else measured
// (the matmul rate of a GPU is the H200's bf16 rate); multiplied by the GPUs of a tensor or row split.
Limits hardware_limits(Device& dev, const MeshSpec& mesh, double bw_gbs, double tflops);

// ---- the model (bench_model.cpp) --------------------------------------------------------------------------

struct ModelShape {
  std::string arch, name, file_type;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  uint64_t n_params = 0, weight_bytes = 0;
  uint64_t bytes_per_step = 0;  // weights a decode step reads (MoE: only the used share of the experts)
  uint64_t layer_matrix_params = 0;
  std::string describe() const;
};

// The shape of the model at path (loaded, with `info`), with the bytes a decode step reads from the GGUF.
ModelShape read_shape(const std::string& path, const ModelInfo& info);
// The Qwen3-8B shape, for --kernels without a model.
ModelShape qwen3_8b_shape();

// One test of the model: its tokens/s per repetition and the mean's fraction of its limit.
struct Result {
  std::string test;
  int batch = 1;
  std::vector<double> tps;  // tokens/s of each repetition
  double fraction = NAN;    // of the relevant limit, for the mean
  std::string limit;        // "bw" or "matmul"
};

struct ModelRuns {
  int n_prompt = 0;          // pp: prompt tokens (0 = skip)
  int n_gen = 0;             // tg: generated tokens per sequence (0 = skip)
  int depth = 0;             // tg: cached positions per sequence before the timed steps (llama-bench -d)
  std::vector<int> batches;  // tg: parallel sequences of each test
  int reps = 1;              // timed repetitions of each test
  KernelProfiler* profiler = nullptr;  // --profile: one more tg run of the first batch, its kernels recorded
};

// --profile: the kernels of `steps` steps of one run, recorded by the kernel profiler (kernel_profile.h).
struct ProfiledRun {
  std::string what;    // "tg128, batch 1", "denoising steps 2..8, device reduction", ...
  int steps = 0;       // the table divides by this: per step
  double wall_seconds = 0;  // the steps' time on the host clock, profiled (CUPTI adds a little per kernel)
  KernelProfile kernels;
};

// The per-step table of a profiled run (markdown): the step's time, the kernels' busy time, the idle time
// between kernels, then the kernels by time (the largest `rows`, the rest summed in one row).
void print_profile_markdown(const ProfiledRun& p, size_t rows = 30);

// pp (when n_prompt > 0), then tg for each batch (when n_gen > 0), each against its limit.
// With runs.profiler, *profiled (when given) gets the kernels of one more tg run of the first batch.
std::vector<Result> bench_model(const std::shared_ptr<Model>& model, const ModelShape& shape,
                                const ModelRuns& runs, const Limits& limits, ProfiledRun* profiled = nullptr);

// ---- the kernels (bench_kernels.cpp) ----------------------------------------------------------------------

struct KernelResult {
  std::string name;
  double seconds = 0;  // per call (median), launched from the host one after another
  // Per call (median) when the same calls are replayed as one recording (a CUDA graph): the kernels' own time,
  // without the host's launch cost between calls (a decode step runs as a graph). 0: not measured (the CPU).
  double graph_seconds = 0;
  double bytes = 0;    // bytes a call must move at least
  double flops = 0;
};

// only: "" (all) or one group, "matmul", "swiglu" (matmul_swiglu) or "attention".
std::vector<KernelResult> bench_kernels(Device& dev, const ModelShape& shape, const std::string& only = "");

// ---- the report (bench_report.cpp) ------------------------------------------------------------------------

struct Report {
  std::string device;      // the main device's name
  std::string model_path;  // -m; empty with --kernels alone
  ModelShape shape;
  MeshSpec mesh;                     // as parsed
  std::string split_mode;            // what the model reports it runs on, else the mesh's
  std::vector<std::string> devices;  // the same
  Limits limits;
  std::vector<Result> results;
  bool kernels = false;  // --kernels was given (the JSON report then has "kernels", even if empty)
  std::vector<KernelResult> kernel_results;
  std::vector<ProfiledRun> profiles;  // --profile
};

void print_json(const Report& r);
void print_markdown(const Report& r);

// ---- --random-weights (bench_random_weights.cpp) ----------------------------------------------------------

// Writes a copy of the GGUF `in` to `out` whose matrices are random values of type_name ("q8_0", ...).
void write_random_weights(const std::string& in, const std::string& type_name, const std::string& out,
                          int threads);

}  // namespace tandem::cli::bench
