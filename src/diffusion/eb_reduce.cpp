// The EB step's per-row reduction on the logits' device or on the host (eb_reduce.h).
#include "diffusion/eb_reduce.h"

#include <cstring>

#include "core/error.h"

namespace tandem::diffusion {

EbReducer::EbReducer(Toggle mode, int32_t n_vocab, int32_t canvas_length, Log log)
    : mode_(mode), n_vocab_(n_vocab), canvas_length_(canvas_length), log_(std::move(log)) {
  check(n_vocab > 0 && canvas_length > 0, "diffusion: the vocabulary and the canvas must not be empty");
}

EbReducer::~EbReducer() = default;

// Auto: only for GPU logits (the point is that the vocabulary never crosses to the host). On: whenever the
// source names a device (so the path also runs on CPU devices, e.g. in tests). Off: never.
bool EbReducer::want_device(const Tensor& logits, Device* dev) {
  if (mode_ == Toggle::Off || device_failed_) return false;
  if (dev == nullptr) {
    if (mode_ == Toggle::On && !noted_host_logits_) {
      log_(
          "diffusion: the device sampler is on, but the canvas logits are in host memory; sampling on the "
          "host");
      noted_host_logits_ = true;
    }
    return false;
  }
  if (mode_ == Toggle::Auto && logits.device.kind != DeviceKind::CUDA) return false;
  return ensure_scratch(*dev);
}

bool EbReducer::ensure_scratch(Device& dev) {
  if (scratch_owner_ == &dev) return true;
  const size_t bytes = 4 * sizeof(int32_t) * size_t(canvas_length_);
  try {
    dev_scratch_ = dev.allocate(bytes);
    host_scratch_ = dev.allocate_host(bytes);
  } catch (const Error& e) {
    dev_scratch_.reset();
    host_scratch_.reset();
    device_failed_ = true;
    log_(std::string("diffusion: the device sampler's scratch could not be allocated on ") + dev.name() +
         " (" + e.what() + "); sampling on the host");
    return false;
  }
  scratch_owner_ = &dev;
  return true;
}

void EbReducer::reduce(const Tensor& logits, Device* logits_device, float inv_temp, std::span<const float> u,
                       std::span<EbRowStats> out) {
  const int64_t C = canvas_length_;
  check(int64_t(u.size()) == C && int64_t(out.size()) == C, "diffusion: one uniform and one result per row");
  check(logits.type == DType::F32 && logits.ne[0] == n_vocab_ && logits.ne[1] >= C && logits.nb[0] == 4,
        "diffusion: the canvas logits must be F32 {" + std::to_string(n_vocab_) +
            ", >= " + std::to_string(C) + "} with contiguous rows, got " + logits.shape_string());
  const Tensor rows = logits.rows(0, C);
  if (logits.device.kind != DeviceKind::CPU &&
      (logits_device == nullptr || logits_device->id() != logits.device)) {
    // The logits are not where the source says: read them through a handle of our own, after waiting for
    // the whole GPU (we do not know the stream that wrote them), on the host path.
    if (!own_device_) {
      log_("diffusion: the canvas logits are on " + logits.device.to_string() +
           ", but the canvas source names " +
           (logits_device ? logits_device->id().to_string() : std::string("no device")) +
           " (CanvasSource::logits_device); reading them after a device-wide synchronize, sampling on the "
           "host");
      own_device_ = create_device(logits.device);
    }
    own_device_->synchronize();
    last_on_device_ = false;
    return reduce_on_host(rows, own_device_.get(), inv_temp, u, out);
  }
  last_on_device_ = want_device(logits, logits_device);
  if (last_on_device_)
    reduce_on_device(*logits_device, rows, inv_temp, u, out);
  else
    reduce_on_host(rows, logits_device, inv_temp, u, out);
}

void EbReducer::reduce_on_device(Device& dev, const Tensor& rows, float inv_temp, std::span<const float> u,
                                 std::span<EbRowStats> out) {
  const int64_t C = canvas_length_;
  const size_t vec = sizeof(int32_t) * size_t(C);
  char* d = static_cast<char*>(dev_scratch_.data());
  char* h = static_cast<char*>(host_scratch_.data());
  std::memcpy(h, u.data(), vec);
  const DeviceId id = dev.id();
  const Tensor du = Tensor::contiguous(DType::F32, {C}, d, id);
  const Tensor dam = Tensor::contiguous(DType::I32, {C}, d + vec, id);
  const Tensor dent = Tensor::contiguous(DType::F32, {C}, d + 2 * vec, id);
  const Tensor dsmp = Tensor::contiguous(DType::I32, {C}, d + 3 * vec, id);
  Stream& s = dev.default_stream();
  dev.copy_from_host(s, d, h, vec);
  dev.ops().diffusion_sample_rows(s, rows, inv_temp, du, dam, dent, dsmp);
  // Only the three results per row come back.
  dev.copy_to_host(s, h + vec, d + vec, 3 * vec);
  s.synchronize();
  const auto* am = reinterpret_cast<const int32_t*>(h + vec);
  const auto* ent = reinterpret_cast<const float*>(h + 2 * vec);
  const auto* smp = reinterpret_cast<const int32_t*>(h + 3 * vec);
  for (int64_t i = 0; i < C; ++i) out[size_t(i)] = {am[i], ent[i], smp[i]};
}

void EbReducer::reduce_on_host(const Tensor& rows, Device* dev, float inv_temp, std::span<const float> u,
                               std::span<EbRowStats> out) {
  const int64_t C = canvas_length_, V = n_vocab_;
  Tensor host_rows = rows;
  if (rows.device.kind != DeviceKind::CPU) {
    // The whole canvas's logits cross to the host: the path the device reduction exists to avoid.
    host_logits_.resize(size_t(V * C));
    Stream& s = dev->default_stream();
    dev->copy_2d(s, host_logits_.data(), size_t(V) * 4, rows.data, rows.nb[1], size_t(V) * 4, size_t(C),
                 CopyKind::DeviceToHost);
    s.synchronize();
    host_rows = Tensor::contiguous(DType::F32, {V, C}, host_logits_.data());
  } else {
    host_rows.device = DeviceId{};
  }
  if (!cpu_) cpu_ = create_device(DeviceId{}, {});
  am_.resize(size_t(C));
  smp_.resize(size_t(C));
  ent_.resize(size_t(C));
  std::vector<float> uu(u.begin(), u.end());
  cpu_->ops().diffusion_sample_rows(
      cpu_->default_stream(), host_rows, inv_temp, Tensor::contiguous(DType::F32, {C}, uu.data()),
      Tensor::contiguous(DType::I32, {C}, am_.data()), Tensor::contiguous(DType::F32, {C}, ent_.data()),
      Tensor::contiguous(DType::I32, {C}, smp_.data()));
  for (int64_t i = 0; i < C; ++i) out[size_t(i)] = {am_[size_t(i)], ent_[size_t(i)], smp_[size_t(i)]};
}

}  // namespace tandem::diffusion
