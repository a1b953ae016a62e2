// A small deterministic CanvasSource for the sampler and driver tests (CPU and GPU): its logits are a fixed
// function of the prefix, the canvas and the position, so a test knows what the loop must converge to. It
// records every call, and can keep its logits on a Device (the device sampler path).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "tandem/diffusion.h"

namespace tandem::test {

class ToyCanvasSource : public CanvasSource {
 public:
  // target(prefix, i): the token position i converges to. sharpness: its logit lead over the field.
  using Target = std::function<int32_t(std::span<const int32_t> prefix, int32_t i)>;

  ToyCanvasSource(int32_t n_vocab, int32_t canvas_length, float sharpness, Target target,
                  Device* device = nullptr)
      : sharpness_(sharpness), target_(std::move(target)), device_(device) {
    info_.n_vocab = n_vocab;
    info_.canvas_length = canvas_length;
    logits_.resize(size_t(n_vocab) * size_t(canvas_length));
    if (device_) device_buf_ = device_->allocate(logits_.size() * sizeof(float));
  }

  const CanvasModelInfo& info() const override { return info_; }
  void begin_block(std::span<const int32_t> prefix) override {
    prefix_.assign(prefix.begin(), prefix.end());
    prefixes.push_back(prefix_);
  }
  const Tensor& forward(std::span<const int32_t> canvas, bool use_sc, float sc_temp_inv) override {
    canvases.emplace_back(canvas.begin(), canvas.end());
    use_sc_calls.push_back(use_sc);
    sc_temp_inv_calls.push_back(sc_temp_inv);
    const int32_t V = info_.n_vocab, C = info_.canvas_length;
    for (int32_t i = 0; i < C; ++i) {
      const int32_t target = target_(prefix_, i);
      float* row = logits_.data() + size_t(i) * size_t(V);
      for (int32_t v = 0; v < V; ++v) {
        // A fixed pseudo-random field in [0, 2), the target ahead by sharpness, and a small pull towards the
        // token the canvas holds there (so the logits depend on the canvas as a denoiser's do).
        uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(v) * 2246822519u ^ uint32_t(canvases.size() % 3);
        h ^= h >> 15;
        h *= 2654435761u;
        h ^= h >> 13;
        row[v] = float(h & 0xffff) / 32768.0f;
        if (v == target) row[v] += sharpness_;
        if (v == canvas[size_t(i)]) row[v] += 0.25f;
      }
    }
    if (device_) {
      device_->copy_from_host(device_->default_stream(), device_buf_.data(), logits_.data(),
                              logits_.size() * sizeof(float));
      tensor_ = Tensor::contiguous(DType::F32, {V, C}, device_buf_.data(), device_->id());
    } else {
      tensor_ = Tensor::contiguous(DType::F32, {V, C}, logits_.data());
    }
    return tensor_;
  }
  std::string describe() const override { return "toy canvas source"; }
  Device* logits_device() const override { return device_; }

  std::vector<std::vector<int32_t>> prefixes;  // begin_block's prefix, per block
  std::vector<std::vector<int32_t>> canvases;  // forward's canvas, per call
  std::vector<bool> use_sc_calls;
  std::vector<float> sc_temp_inv_calls;

 private:
  CanvasModelInfo info_;
  float sharpness_;
  Target target_;
  Device* device_;
  Buffer device_buf_;
  std::vector<int32_t> prefix_;
  std::vector<float> logits_;
  Tensor tensor_;
};

}  // namespace tandem::test
