// The CPU device: host memory, trivial streams and events, and CpuOps running on the device's thread pool.
// Several CPU devices (cpu:0, cpu:1, ...) may exist at once, each with its own pool; split-mode tests use
// them as stand-ins for GPUs.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops_impl.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

class CpuStream final : public Stream {
 public:
  explicit CpuStream(DeviceId id) : id_(id) {}
  DeviceId device() const override { return id_; }
  void synchronize() override {}

 private:
  DeviceId id_;
};

// CPU work is finished when the call that issued it returns, so events have nothing to wait for.
class CpuEvent final : public Event {
 public:
  void record(Stream&) override {}
  void wait(Stream&) override {}
  void synchronize() override {}
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(ThreadPool& pool) : pool_(pool) {}

  void reserve(const WorkspacePlan& plan) override;
  // Bytes of scratch held now (for tests of the no-allocation rule and for memory reports).
  size_t workspace_bytes() const { return ws_.capacity_bytes(); }

  void matmul(Stream&, const Tensor& W, const Tensor& x, const Tensor& y) override;
  void get_rows(Stream&, const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void embed_rows(Stream&, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                  const Tensor* added_ids, const Tensor& out) override;
  void rms_norm(Stream&, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) override;
  void rope(Stream&, const Tensor& x, const Tensor& positions, const RopeParams& p) override;
  void kv_store(Stream&, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                const Tensor& slot_mapping) override;
  void attention(Stream&, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch, float scale,
                 const Tensor& out) override;
  void silu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void gelu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void add(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void mul(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void scale(Stream&, const Tensor& x, float factor, const Tensor& out) override;
  void softcap(Stream&, const Tensor& x, float cap, const Tensor& out) override;
  void fill(Stream&, const Tensor& out, float value) override;
  void softmax_rows(Stream&, const Tensor& x, const Tensor& out) override;
  void copy(Stream&, const Tensor& src, const Tensor& dst) override;
  void argmax_rows(Stream&, const Tensor& logits, const Tensor& out) override;
  void sample_rows(Stream&, const Tensor& logits, const SamplerParams& params, const Tensor& uniforms,
                   const Tensor& out) override;
  void diffusion_sample_rows(Stream&, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                             const Tensor& argmax, const Tensor& entropy, const Tensor& sampled) override;
  void moe_route(Stream&, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                 const Tensor& weights) override;
  void matmul_id(Stream&, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) override;
  void moe_combine(Stream&, const Tensor& y, const Tensor& weights, const Tensor& out) override;

 private:
  ThreadPool& pool_;
  Workspace ws_;
};

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const DeviceOptions& options);

  DeviceId id() const override { return id_; }
  std::string name() const override;
  size_t total_memory() const override;
  size_t free_memory() const override;
  Buffer allocate(size_t bytes) override;
  Buffer allocate_host(size_t bytes) override { return allocate(bytes); }
  Stream& default_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(id_); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  void synchronize() override {}
  void copy_from_host(Stream&, void* dst, const void* src, size_t bytes) override;
  void copy_to_host(Stream&, void* dst, const void* src, size_t bytes) override;
  void copy_device_to_device(Stream&, void* dst, const void* src, size_t bytes) override;
  void copy_2d(Stream&, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes,
               size_t height, CopyKind kind) override;
  void copy_to_peer(Stream&, void* dst, Device& dst_dev, const void* src, size_t bytes) override;
  Ops& ops() override { return ops_; }

  ThreadPool& thread_pool() { return pool_; }

 private:
  DeviceId id_;
  ThreadPool pool_;
  CpuStream stream_;
  CpuOps ops_;
};

}  // namespace tandem::cpu
