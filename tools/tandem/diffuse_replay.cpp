// Hidden `tandem diffuse --replay-logits FILE [--replay-device DEV] --trace OUT.json`: the EB sampler alone,
// over logits recorded in a file instead of a model, writing every step's draws and decisions as JSON. The
// reference check (tests/reference/eb_sampler_parity.py) gives transformers' EntropyBoundSampler the same
// logits and draws and compares the decisions; --replay-device cuda:0 runs the device reduction.
//
// The file: "TEBL", then uint32 n_vocab, canvas_length, n_steps, then n_steps * canvas_length rows of n_vocab
// float32 (step-major, little-endian). Step k of every block reads the file's step k.
#include "diffuse_replay.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/file_io.h"
#include "parallel/mesh.h"

namespace tandem::cli {
namespace {

class ReplaySource : public CanvasSource {
 public:
  ReplaySource(const std::string& path, const std::string& device) {
    std::ifstream in(path, std::ios::binary);
    check(static_cast<bool>(in), "--replay-logits: cannot read '" + path + "'");
    char magic[4] = {};
    uint32_t dims[3] = {};
    in.read(magic, 4);
    in.read(reinterpret_cast<char*>(dims), sizeof dims);
    check(in && std::memcmp(magic, "TEBL", 4) == 0,
          "--replay-logits: '" + path + "' is not a logits file (no TEBL header)");
    check(dims[0] >= 1 && dims[0] <= (1u << 24) && dims[1] >= 1 && dims[1] <= 65536 && dims[2] >= 1 &&
              dims[2] <= 100000,
          "--replay-logits: implausible sizes in '" + path + "'");
    info_.n_vocab = int32_t(dims[0]);
    info_.canvas_length = int32_t(dims[1]);
    n_steps_ = int32_t(dims[2]);
    const size_t n = size_t(dims[0]) * dims[1] * dims[2];
    logits_.resize(n);
    in.read(reinterpret_cast<char*>(logits_.data()), std::streamsize(n * sizeof(float)));
    check(in.gcount() == std::streamsize(n * sizeof(float)),
          "--replay-logits: '" + path + "' is truncated (" + std::to_string(n_steps_) + " steps expected)");
    if (!device.empty()) {
      device_ = create_device(parse_device_id(device, "--replay-device"));
      buf_ = device_->allocate(n * sizeof(float));
      device_->copy_from_host(device_->default_stream(), buf_.data(), logits_.data(), n * sizeof(float));
      device_->default_stream().synchronize();
    }
  }
  int32_t n_steps() const { return n_steps_; }
  const CanvasModelInfo& info() const override { return info_; }
  void begin_block(std::span<const int32_t>) override { step_ = 0; }
  const Tensor& forward(std::span<const int32_t>, bool, float) override {
    check(step_ < n_steps_, "--replay-logits: the file has " + std::to_string(n_steps_) +
                                " steps; give --diffusion-steps at most that");
    const size_t row = size_t(info_.n_vocab), offset = size_t(step_++) * row * size_t(info_.canvas_length);
    float* base = device_ ? static_cast<float*>(buf_.data()) : logits_.data();
    tensor_ = Tensor::contiguous(DType::F32, {info_.n_vocab, info_.canvas_length}, base + offset,
                                 device_ ? device_->id() : DeviceId{});
    return tensor_;
  }
  std::string describe() const override {
    return "replayed logits" + (device_ ? " on " + device_->name() : std::string(" on the host"));
  }
  Device* logits_device() const override { return device_.get(); }

 private:
  CanvasModelInfo info_;
  int32_t n_steps_ = 0, step_ = 0;
  std::vector<float> logits_;
  std::unique_ptr<Device> device_;
  Buffer buf_;
  Tensor tensor_;
};

}  // namespace

void add_replay_options(CLI::App* cmd, ReplayOptions* o) {
  cmd->add_option("--replay-logits", o->logits, "Run the sampler over recorded logits (reference checks)")
      ->group("");
  cmd->add_option("--replay-device", o->device, "Device the replayed logits live on (default: host)")
      ->group("");
  cmd->add_option("--trace", o->trace, "Write every step's draws and decisions as JSON")->group("");
}

void run_replay(const ReplayOptions& r, const DiffuseOptions& o) {
  check_diffusion_options(o);
  check(!r.trace.empty(), "--replay-logits needs --trace FILE (the decisions are the output)");
  check(!same_file(r.trace, r.logits),
        "--trace '" + r.trace + "' is the --replay-logits file; write the trace to a different path");
  check(o.seed >= 0 && o.seed < (int64_t(1) << 32), "--replay-logits needs --seed in [0, 2^32)");
  ReplaySource src(r.logits, r.device);
  DiffusionParams p;
  p.eb.max_steps = o.steps > 0 ? o.steps : src.n_steps();
  if (o.t_min != -1) p.eb.t_min = float(o.t_min);
  if (o.t_max != -1) p.eb.t_max = float(o.t_max);
  if (o.entropy_bound != -1) p.eb.entropy_bound = float(o.entropy_bound);
  if (o.stability_threshold != -1) p.eb.stability_threshold = o.stability_threshold;
  if (o.confidence_threshold != -1) p.eb.confidence_threshold = float(o.confidence_threshold);
  p.eb.seed = uint32_t(o.seed);
  p.n_predict = src.info().canvas_length;
  p.n_blocks = 1;
  p.repeat_run = 0;  // the whole canvas is the output
  p.gpu_sample_reduce = parse_toggle(o.gpu_sample_reduce, "--diffusion-gpu-sample-reduce");

  nlohmann::json steps = nlohmann::json::array();
  const DiffusionResult res = diffuse(src, std::vector<int32_t>{0}, p, [&](const DiffusionStep& s) {
    nlohmann::json j;
    j["step"] = s.step;
    j["temperature"] = s.temperature;
    j["canvas"] = std::vector<int32_t>(s.canvas.begin(), s.canvas.end());
    j["u"] = std::vector<float>(s.u.begin(), s.u.end());
    j["renoise"] = std::vector<int32_t>(s.renoise.begin(), s.renoise.end());
    j["argmax"] = std::vector<int32_t>(s.argmax.begin(), s.argmax.end());
    j["entropy"] = std::vector<float>(s.entropy.begin(), s.entropy.end());
    j["sampled"] = std::vector<int32_t>(s.sampled.begin(), s.sampled.end());
    j["accepted"] = std::vector<int>(s.accepted.begin(), s.accepted.end());
    j["next_canvas"] = std::vector<int32_t>(s.next_canvas.begin(), s.next_canvas.end());
    j["mean_entropy"] = s.mean_entropy;
    j["held"] = s.held;
    j["stable"] = s.stable;
    j["confident"] = s.confident;
    j["device_reduce"] = s.device_reduce;
    steps.push_back(std::move(j));
    return true;
  });
  nlohmann::json out;
  out["n_vocab"] = src.info().n_vocab;
  out["canvas_length"] = src.info().canvas_length;
  out["max_steps"] = p.eb.max_steps;
  out["t_min"] = p.eb.t_min;
  out["t_max"] = p.eb.t_max;
  out["entropy_bound"] = p.eb.entropy_bound;
  out["stability_threshold"] = p.eb.stability_threshold;
  out["confidence_threshold"] = p.eb.confidence_threshold;
  out["seed"] = p.eb.seed;
  out["converged"] = res.blocks.at(0).converged;
  out["device_reduce"] = res.device_reduce;
  out["final"] = res.tokens;
  out["steps"] = std::move(steps);
  std::ofstream f(r.trace);
  check(static_cast<bool>(f), "--trace: cannot write '" + r.trace + "'");
  f << out.dump() << "\n";
  check(static_cast<bool>(f), "--trace: writing '" + r.trace + "' failed");
  std::fprintf(stderr, "replay: %d steps, %s, %s\n", res.total_steps,
               res.blocks.at(0).converged ? "converged" : "not converged", src.describe().c_str());
}

}  // namespace tandem::cli
