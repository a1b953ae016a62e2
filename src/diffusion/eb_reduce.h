// The per-row reduction of one EB step (D.6 f / D.8): argmax, entropy and inverse-CDF sample of every canvas
// row, with Ops::diffusion_sample_rows either on the device that holds the logits (only the uniforms go up
// and three numbers per row come back) or on the host (device logits are copied down first).
//
// The device path soft-fails: when its scratch cannot be allocated, or the logits are on a GPU the source
// named no Device for, it logs one line and the host path takes over.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "diffusion/eb_sampler.h"

namespace tandem::diffusion {

class EbReducer {
 public:
  using Log = std::function<void(const std::string&)>;
  // mode: DiffusionParams::gpu_sample_reduce. log: one-line notes (never null).
  EbReducer(Toggle mode, int32_t n_vocab, int32_t canvas_length, Log log);
  ~EbReducer();

  // Rows 0 .. canvas_length-1 of logits (F32 {n_vocab, >= canvas_length}, elements of a row contiguous) at
  // 1/t = inv_temp with the uniforms u. logits_device: the Device holding them when they are not host memory
  // (CanvasSource::logits_device). GPU logits without that Device (a source breaking its contract) are read
  // through a handle of our own after a device-wide synchronize, on the host path, with one log line. Throws
  // Error for logits of the wrong shape or type.
  void reduce(const Tensor& logits, Device* logits_device, float inv_temp, std::span<const float> u,
              std::span<EbRowStats> out);
  // Whether the last reduce ran on the logits' device.
  bool last_on_device() const { return last_on_device_; }

 private:
  bool want_device(const Tensor& logits, Device* dev);
  bool ensure_scratch(Device& dev);
  void reduce_on_device(Device& dev, const Tensor& rows, float inv_temp, std::span<const float> u,
                        std::span<EbRowStats> out);
  void reduce_on_host(const Tensor& rows, Device* dev, float inv_temp, std::span<const float> u,
                      std::span<EbRowStats> out);

  Toggle mode_;
  int32_t n_vocab_, canvas_length_;
  Log log_;
  bool last_on_device_ = false;
  bool device_failed_ = false;  // the scratch could not be allocated: host path from then on
  bool noted_host_logits_ = false;
  Device* scratch_owner_ = nullptr;
  Buffer dev_scratch_;           // u {C} F32, argmax {C} I32, entropy {C} F32, sampled {C} I32 on the device
  Buffer host_scratch_;          // the same on the host (pinned where the device offers it)
  std::unique_ptr<Device> cpu_;  // the host path's reference op (the CPU backend)
  std::unique_ptr<Device> own_device_;  // a handle to a GPU whose logits the source named no Device for
  std::vector<float> host_logits_;      // device logits copied down for the host path
  std::vector<int32_t> am_, smp_;
  std::vector<float> ent_;
};

}  // namespace tandem::diffusion
