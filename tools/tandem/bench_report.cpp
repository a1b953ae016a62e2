// The report of `tandem bench` (bench.h): the device, the commit, the limits, the model, then one row per
// test and per kernel with its fraction of the limit, as a markdown table or as JSON (-o json).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench.h"

namespace tandem::cli::bench {

void print_json(const Report& r) {
  const Limits& l = r.limits;
  nlohmann::json j;
  j["device"] = r.device;
  j["commit"] = TANDEM_GIT_COMMIT;
  j["bandwidth_gbs"] = l.bw / 1e9;
  j["limit_devices"] = l.limit_devices;
  j["bandwidth_source"] = l.bw_given ? "given" : "measured copy";
  j["matmul_tflops"] = l.rate / 1e12;
  j["matmul_source"] = l.rate_source;
  j["split_mode"] = r.split_mode;
  j["devices"] = r.devices;
  j["split"] = r.mesh.describe();
  j["model"] = {{"path", r.model_path},
                {"arch", r.shape.arch},
                {"types", r.shape.file_type},
                {"shape", r.shape.describe()},
                {"n_params", r.shape.n_params},
                {"weight_bytes", r.shape.weight_bytes},
                {"bytes_per_step", r.shape.bytes_per_step}};
  nlohmann::json arr = nlohmann::json::array();
  for (const Result& res : r.results) {
    const Stats st = stats(res.tps);
    arr.push_back({{"test", res.test},
                   {"batch", res.batch},
                   {"tokens_per_s", st.mean},
                   {"stddev", st.sd},
                   {"samples", res.tps},
                   {"fraction_of_limit", res.fraction},
                   {"limit", res.limit}});
  }
  j["results"] = arr;
  nlohmann::json karr = nlohmann::json::array();
  for (const KernelResult& k : r.kernel_results)
    karr.push_back({{"kernel", k.name},
                    {"us", k.seconds * 1e6},
                    {"gbs", k.bytes / k.seconds / 1e9},
                    {"fraction_of_bw", k.bytes / k.seconds / l.bw},
                    {"tflops", k.flops / k.seconds / 1e12},
                    {"fraction_of_matmul", k.flops / k.seconds / l.rate},
                    {"graph_us", k.graph_seconds * 1e6},  // 0: not measured (the CPU)
                    {"graph_fraction_of_bw", k.graph_seconds > 0 ? k.bytes / k.graph_seconds / l.bw : 0.0}});
  if (r.kernels) j["kernels"] = karr;
  nlohmann::json parr = nlohmann::json::array();
  for (const ProfiledRun& p : r.profiles) {
    const double n = std::max(p.steps, 1);
    nlohmann::json ks = nlohmann::json::array();
    for (const KernelStat& k : p.kernels.kernels)
      ks.push_back({{"kernel", k.name}, {"calls_per_step", double(k.calls) / n}, {"us_per_step", k.seconds / n * 1e6}});
    parr.push_back({{"run", p.what},
                    {"steps", p.steps},
                    {"step_us", p.wall_seconds / n * 1e6},
                    {"kernel_busy_us", p.kernels.busy_seconds / n * 1e6},
                    {"idle_between_kernels_us", p.kernels.idle_seconds() / n * 1e6},
                    {"launches_per_step", double(p.kernels.launches) / n},
                    {"kernels", ks}});
  }
  if (!r.profiles.empty()) j["profile"] = parr;
  std::printf("%s\n", j.dump(2).c_str());
}

void print_profile_markdown(const ProfiledRun& p, size_t rows) {
  const double n = std::max(p.steps, 1);
  const KernelProfile& k = p.kernels;
  std::printf("\n## Kernels of %s: per step, mean of %d steps (CUPTI; the profiled steps run a little slower)\n\n",
              p.what.c_str(), p.steps);
  if (k.launches == 0) {
    std::printf("no kernel was recorded in the window\n");
    return;
  }
  std::printf(
      "step %.1f us (host clock); kernels busy %.1f us (%.1f%% of the step); no kernel running between the "
      "first and the last: %.1f us; outside them (host, sampling copy): %.1f us; %.1f kernels a step\n\n",
      p.wall_seconds / n * 1e6, k.busy_seconds / n * 1e6, 100.0 * k.busy_seconds / std::max(p.wall_seconds, 1e-12),
      k.idle_seconds() / n * 1e6, std::max(0.0, p.wall_seconds - k.span_seconds) / n * 1e6, double(k.launches) / n);
  std::printf("| kernel | calls / step | us / step | us / call | share of kernel time |\n| --- | ---: | ---: | ---: | ---: |\n");
  double rest_s = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < k.kernels.size(); ++i) {
    const KernelStat& s = k.kernels[i];
    if (i >= rows) {
      rest_s += s.seconds;
      rest_calls += s.calls;
      continue;
    }
    std::printf("| %s | %.2f | %.1f | %.2f | %.1f%% |\n", s.name.c_str(), double(s.calls) / n, s.seconds / n * 1e6,
                s.seconds / double(s.calls) * 1e6, 100.0 * s.seconds / k.kernel_seconds);
  }
  if (rest_calls > 0)
    std::printf("| (%zu other kernels) | %.2f | %.1f | | %.1f%% |\n", k.kernels.size() - rows, double(rest_calls) / n,
                rest_s / n * 1e6, 100.0 * rest_s / k.kernel_seconds);
}

void print_markdown(const Report& r) {
  const Limits& l = r.limits;
  std::printf("device: %s\ncommit: %s\n", r.device.c_str(), TANDEM_GIT_COMMIT);
  std::printf("split: %s\n", r.mesh.describe().c_str());
  if (r.devices.size() > 1) {
    std::string list;
    for (const std::string& d : r.devices) {
      if (!list.empty()) list += "; ";
      list += d;
    }
    std::printf("devices: %s\n", list.c_str());
  }
  std::string times;
  if (l.limit_devices > 1) times = ", x" + std::to_string(l.limit_devices) + " for the GPUs of the split";
  std::printf("limits: copy bandwidth %.1f GB/s (%s), matmul %.3g TFLOP/s (%s)%s\n", l.bw / 1e9,
              l.bw_given ? "given" : "measured", l.rate / 1e12, l.rate_source.c_str(), times.c_str());
  if (!r.model_path.empty())
    std::printf("model: %s (%s), %.2f GiB, %.2f B params\nshape: %s\n", r.model_path.c_str(),
                r.shape.file_type.c_str(), double(r.shape.weight_bytes) / double(1u << 30),
                double(r.shape.n_params) / 1e9, r.shape.describe().c_str());
  if (!r.model_path.empty())
    std::printf(
        "weights a batch-1 decode step reads: %.3f GiB (mixture of experts: the used experts only); at "
        "the bandwidth limit %.1f steps/s\n",
        double(r.shape.bytes_per_step) / double(1u << 30),
        l.bw / double(std::max<uint64_t>(r.shape.bytes_per_step, 1)));
  if (!r.results.empty()) {
    std::printf("\n| test | batch | t/s | ± | fraction of limit |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (const Result& res : r.results) {
      const Stats st = stats(res.tps);
      std::printf("| %s | %d | %.2f | %.2f | %.1f%% of %s |\n", res.test.c_str(), res.batch, st.mean, st.sd,
                  100.0 * res.fraction, res.limit == "bw" ? "bandwidth" : "matmul rate");
    }
  }
  if (!r.kernel_results.empty()) {
    // "in a graph": the same calls replayed as one CUDA graph (no host launch cost between them; a decode step
    // runs that way); the gap to the first columns is what launching each call from the host costs.
    std::printf(
        "\n| kernel | us | GB/s | %% of bw | TFLOP/s | %% of matmul | us in a graph | %% of bw in a graph |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const KernelResult& k : r.kernel_results) {
      char graph[64] = "- | -";
      if (k.graph_seconds > 0)
        std::snprintf(graph, sizeof graph, "%.1f | %.1f%%", k.graph_seconds * 1e6,
                      100.0 * k.bytes / k.graph_seconds / l.bw);
      std::printf("| %s | %.1f | %.0f | %.1f%% | %.1f | %.1f%% | %s |\n", k.name.c_str(), k.seconds * 1e6,
                  k.bytes / k.seconds / 1e9, 100.0 * k.bytes / k.seconds / l.bw, k.flops / k.seconds / 1e12,
                  100.0 * k.flops / k.seconds / l.rate, graph);
    }
  }
  for (const ProfiledRun& p : r.profiles) print_profile_markdown(p);
}

}  // namespace tandem::cli::bench
