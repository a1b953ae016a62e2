#include "backend/cpu/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul_kernels.h"
#include "core/out_of_memory.h"

namespace tandem::cpu {

// ---- ops: bind the interface to the implementations -------------------------------------------------------

void CpuOps::reserve(const WorkspacePlan& plan) {
  TANDEM_CPU_CHECK(plan.max_rows >= 0 && plan.max_matmul_in >= 0 && plan.max_head_dim >= 0 &&
                       plan.max_n_head >= 0 && plan.max_seq_len >= 0 && plan.max_vocab >= 0,
                   "reserve: workspace bounds must be >= 0");
  const int n_threads = pool_.n_threads();
  const int64_t n_in = plan.max_matmul_in;
  const size_t act_row = std::max(act_row_bytes(ActFormat::Q8x32, n_in / 32 * 32),
                                  act_row_bytes(ActFormat::Q8x256, n_in / 256 * 256));
  const int64_t max_rows = std::max<int64_t>({plan.max_rows, plan.max_routed_rows, 1});
  ws_.act(act_row * size_t(max_rows));
  if (vnni_enabled())  // the packed activation groups of the Q8_0 prefill path (matmul.cpp)
    ws_.packed(size_t((max_rows + kPackedRows - 1) / kPackedRows * (n_in / 32)) * sizeof(ActQ8Block32x16));
  size_t stride = 0;
  ws_.per_thread(std::max(attention_scratch_floats(plan.max_n_head, plan.max_head_dim),
                          rope_scratch_floats(plan.max_head_dim)),
                 n_threads, &stride);
  ws_.per_thread_i32(size_t(plan.max_vocab), n_threads, &stride);
}

void CpuOps::matmul(Stream&, const Tensor& W, const Tensor& x, const Tensor& y) {
  cpu::matmul(pool_, ws_, W, x, y);
}
void CpuOps::get_rows(Stream&, const Tensor& table, const Tensor& ids, const Tensor& out) {
  cpu::get_rows(pool_, table, ids, out);
}
void CpuOps::embed_rows(Stream&, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                        const Tensor* added_ids, const Tensor& out) {
  cpu::embed_rows(pool_, table, ids, scale, added, added_ids, out);
}
void CpuOps::rms_norm(Stream&, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) {
  cpu::rms_norm(pool_, x, weight, eps, out);
}
void CpuOps::rope(Stream&, const Tensor& x, const Tensor& positions, const RopeParams& p) {
  cpu::rope(pool_, ws_, x, positions, p);
}
void CpuOps::kv_store(Stream&, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                      const Tensor& slot_mapping) {
  cpu::kv_store(pool_, kv, k, v, slot_mapping);
}
void CpuOps::attention(Stream&, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                       float scale, const Tensor& out) {
  cpu::attention(pool_, ws_, q, kv, batch, scale, out);
}
void CpuOps::silu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) {
  cpu::silu_mul(pool_, gate, up, out);
}
void CpuOps::gelu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) {
  cpu::gelu_mul(pool_, gate, up, out);
}
void CpuOps::add(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::add(pool_, a, b, out);
}
void CpuOps::mul(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::mul(pool_, a, b, out);
}
void CpuOps::scale(Stream&, const Tensor& x, float factor, const Tensor& out) {
  cpu::scale(pool_, x, factor, out);
}
void CpuOps::softcap(Stream&, const Tensor& x, float cap, const Tensor& out) {
  cpu::softcap(pool_, x, cap, out);
}
void CpuOps::fill(Stream&, const Tensor& out, float value) {
  cpu::fill(pool_, out, value);
}
void CpuOps::softmax_rows(Stream&, const Tensor& x, const Tensor& out) {
  cpu::softmax_rows(pool_, x, out);
}
void CpuOps::copy(Stream&, const Tensor& src, const Tensor& dst) {
  cpu::copy(pool_, src, dst);
}
void CpuOps::argmax_rows(Stream&, const Tensor& logits, const Tensor& out) {
  cpu::argmax_rows(pool_, logits, out);
}
void CpuOps::sample_rows(Stream&, const Tensor& logits, const SamplerParams& params, const Tensor& uniforms,
                         const Tensor& out) {
  cpu::sample_rows(pool_, ws_, logits, params, uniforms, out);
}
void CpuOps::diffusion_sample_rows(Stream&, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                                   const Tensor& argmax, const Tensor& entropy, const Tensor& sampled) {
  cpu::diffusion_sample_rows(pool_, logits, inv_temp, uniforms, argmax, entropy, sampled);
}

void CpuOps::moe_route(Stream&, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                       const Tensor& weights) {
  cpu::moe_route(pool_, logits, expert_scale, ids, weights);
}

void CpuOps::matmul_id(Stream&, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) {
  cpu::matmul_id(pool_, ws_, W, x, ids, y);
}

void CpuOps::moe_combine(Stream&, const Tensor& y, const Tensor& weights, const Tensor& out) {
  cpu::moe_combine(pool_, y, weights, out);
}

// ---- device -----------------------------------------------------------------------------------------------

CpuDevice::CpuDevice(int index, const DeviceOptions& options)
    : id_{DeviceKind::CPU, index}, pool_(options.n_threads), stream_(id_), ops_(pool_) {
  TANDEM_CPU_CHECK(index >= 0, "cpu device index must be >= 0, got " + std::to_string(index));
  TANDEM_CPU_CHECK(options.n_threads >= 0, "the number of threads must be >= 0 (0 = all cores)");
}

std::string CpuDevice::name() const {
  return id_.to_string() + " (" + std::to_string(pool_.n_threads()) + " threads, " +
         (simd_enabled() ? "avx2+fma" : "scalar") + ")";
}

size_t CpuDevice::total_memory() const {
  return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
}

size_t CpuDevice::free_memory() const {
  return size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
}

Buffer CpuDevice::allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return Buffer(p, bytes, id_, [](void* data, void*) { std::free(data); });
}

void CpuDevice::copy_from_host(Stream&, void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuDevice::copy_to_host(Stream&, void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuDevice::copy_device_to_device(Stream&, void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuDevice::copy_2d(Stream&, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t width_bytes, size_t height, CopyKind) {
  TANDEM_CPU_CHECK(width_bytes <= dst_pitch && width_bytes <= src_pitch,
                   "copy_2d: width is larger than a pitch");
  for (size_t i = 0; i < height; ++i)
    std::memmove(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch,
                 width_bytes);
}
void CpuDevice::copy_to_peer(Stream&, void* dst, Device& dst_dev, const void* src, size_t bytes) {
  TANDEM_CPU_CHECK(dst_dev.id().kind == DeviceKind::CPU,
                   "copy_to_peer: a CPU device can only copy to another CPU device");
  if (bytes) std::memmove(dst, src, bytes);
}

}  // namespace tandem::cpu
