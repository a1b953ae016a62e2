// Per-kernel GPU time of a stretch of work: which kernels a decode step (or a denoising step) spends its time
// in, and how much of the step no kernel runs at all (launch gaps, host work, synchronizations). The GPU
// machines this project measures on have no Nsight Systems; this is the part of it the speed work needs
// (`tandem bench --profile`, bench/BENCHMARKS.md's per-kernel tables).
//
// The records come from the CUDA profiling interface (CUPTI, its activity API), loaded at run time with dlopen
// (src/backend/cuda/kernel_profile_cupti.cpp), so that the build needs no CUPTI library and a machine without
// one still runs everything but --profile. Kernels launched from CUDA graphs are recorded too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

// One kernel execution: its (mangled or demangled) name and its start and end on the GPU clock, in ns.
struct KernelRecord {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
};

// The kernels of one name (short_kernel_name) within a window.
struct KernelStat {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;  // sum of the calls' durations
};

struct KernelProfile {
  std::vector<KernelStat> kernels;  // largest total time first (ties: by name)
  int64_t launches = 0;             // kernel executions in the window
  double kernel_seconds = 0;        // sum of all kernel durations (more than busy when kernels overlap)
  double busy_seconds = 0;          // time at least one kernel ran: the union of the kernels' intervals
  double span_seconds = 0;          // first kernel start to last kernel end
  double idle_seconds() const { return span_seconds - busy_seconds; }  // no kernel running, inside the span
};

// Aggregates records given in any order: per short name, the union of the intervals (busy) and the span.
KernelProfile summarize_kernels(std::vector<KernelRecord> records);

// A kernel's name for a table: demangled when it is a mangled C++ name, without the return type, the
// namespaces and the parameter list; template arguments kept (they tell a Q4_K kernel from a Q8_0 one).
// "void tandem::cuda::(anonymous namespace)::gemv<(tandem::DType)8, 1>(tandem::cuda::GemvArgs, float const*)"
// -> "gemv<(DType)8, 1>".
std::string short_kernel_name(const std::string& name);

// Records every kernel the process runs on any GPU from start() on; windows select the part to report.
class KernelProfiler {
 public:
  // Starts recording. Returns null, with the reason in *why_not, when this build has no CUDA or the CUPTI
  // library cannot be loaded or enabled. Start it before the work to profile is first run: kernels of CUDA
  // graphs instantiated before are not guaranteed to be recorded. One profiler at a time per process.
  static std::unique_ptr<KernelProfiler> start(std::string* why_not);
  virtual ~KernelProfiler() = default;

  // Opens a window: records of kernels that start from now on count. Drops what was recorded before.
  virtual void begin_window() = 0;
  // Closes the window and returns its kernels. The caller first waits for the work to finish on the device
  // (a kernel still running is not in the window).
  virtual KernelProfile end_window() = 0;
};

}  // namespace tandem
