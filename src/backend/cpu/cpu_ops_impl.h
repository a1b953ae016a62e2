// Internals shared by the CPU op implementations: the workspace, the argument checks (checks.cpp) and the ops
// themselves, each a free function in the file of its kind (matmul.cpp, attention.cpp, rope.cpp, norm.cpp,
// elementwise.cpp, sampling.cpp); CpuOps (cpu_device.h) binds them to the Ops interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// Scratch memory of the CPU ops. Rule: it only grows, and only when a call needs more than any call before it
// (or than Ops::reserve planned). A session that reserves its largest shapes at plan time therefore sees no
// allocation during steps; unreserved use still works and pays one allocation per new maximum.
class Workspace {
 public:
  // Bytes for matmul's quantized activations.
  uint8_t* act(size_t bytes) {
    if (act_.size() < bytes) act_.resize(bytes);
    return act_.data();
  }
  // Bytes for the packed activation groups of the VNNI prefill matmul.
  uint8_t* packed(size_t bytes) {
    if (packed_.size() < bytes) packed_.resize(bytes);
    return packed_.data();
  }
  // `floats` floats of private scratch for each of n_threads threads; returns thread 0's, thread t's is at
  // t * stride (stride >= floats, a multiple of 16 floats: slices start 64-byte multiples apart).
  float* per_thread(size_t floats, int n_threads, size_t* stride) {
    const size_t s = (floats + 15) / 16 * 16;
    if (per_thread_.size() < s * size_t(n_threads)) per_thread_.resize(s * size_t(n_threads));
    *stride = s;
    return per_thread_.data();
  }
  // The same for int32 scratch (token indices of sample_rows).
  int32_t* per_thread_i32(size_t n, int n_threads, size_t* stride) {
    const size_t s = (n + 15) / 16 * 16;
    if (per_thread_i32_.size() < s * size_t(n_threads)) per_thread_i32_.resize(s * size_t(n_threads));
    *stride = s;
    return per_thread_i32_.data();
  }
  size_t capacity_bytes() const {
    return act_.size() + packed_.size() + per_thread_.size() * sizeof(float) +
           per_thread_i32_.size() * sizeof(int32_t);
  }

 private:
  std::vector<uint8_t> act_;
  std::vector<uint8_t> packed_;
  std::vector<float> per_thread_;
  std::vector<int32_t> per_thread_i32_;
};

// Scratch floats per thread that attention and rope need, for reserve() and for the ops themselves.
size_t attention_scratch_floats(int64_t n_head, int64_t head_dim);
size_t rope_scratch_floats(int64_t head_dim);

// ---- argument checks (throw Error with the op and argument name) ------------------------------------------

// Like tandem::check, but the message is only built when the check fails: ops run hundreds of times per step
// and must not format (or allocate) strings on the success path.
#define TANDEM_CPU_CHECK(cond, message)          \
  do {                                           \
    if (!(cond)) throw ::tandem::Error(message); \
  } while (0)

void check_on_cpu(const char* op, const char* name, const Tensor& t);
void check_type(const char* op, const char* name, const Tensor& t, DType type);
// dtype F32, on CPU, elements of a row contiguous.
void check_f32(const char* op, const char* name, const Tensor& t);
void check_i32_vector(const char* op, const char* name, const Tensor& t, int64_t n);
void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b);
void check_dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2 = 1,
                int64_t ne3 = 1);

// Pointer to flat row r (0 <= r < t.nrows()) of a possibly strided tensor.
inline char* row_ptr(const Tensor& t, int64_t r) {
  const int64_t i1 = r % t.ne[1];
  const int64_t i2 = (r / t.ne[1]) % t.ne[2];
  const int64_t i3 = r / (t.ne[1] * t.ne[2]);
  return static_cast<char*>(t.data) + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

// Items per task when n items are split into about `tasks_per_thread` tasks per thread, at least
// `min_per_task` (and at least 1).
int64_t items_per_task(int64_t n, int n_threads, int64_t min_per_task, int tasks_per_thread = 4);

// ---- the ops ----------------------------------------------------------------------------------------------

void matmul(ThreadPool& pool, Workspace& ws, const Tensor& W, const Tensor& x, const Tensor& y);
void get_rows(ThreadPool& pool, const Tensor& table, const Tensor& ids, const Tensor& out);
void embed_rows(ThreadPool& pool, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                const Tensor* added_ids, const Tensor& out);
void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor* weight, float eps, const Tensor& out);
void rope(ThreadPool& pool, Workspace& ws, const Tensor& x, const Tensor& positions, const RopeParams& p);
void kv_store(ThreadPool& pool, const KvLayerView& kv, const Tensor& k, const Tensor& v,
              const Tensor& slot_mapping);
void attention(ThreadPool& pool, Workspace& ws, const Tensor& q, const KvLayerView& kv,
               const AttentionBatch& batch, float scale, const Tensor& out);
void silu_mul(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out);
void gelu_mul(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out);
void add(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out);
void mul(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out);
void scale(ThreadPool& pool, const Tensor& x, float factor, const Tensor& out);
void softcap(ThreadPool& pool, const Tensor& x, float cap, const Tensor& out);
void fill(ThreadPool& pool, const Tensor& out, float value);
void softmax_rows(ThreadPool& pool, const Tensor& x, const Tensor& out);
void copy(ThreadPool& pool, const Tensor& src, const Tensor& dst);
void argmax_rows(ThreadPool& pool, const Tensor& logits, const Tensor& out);
void sample_rows(ThreadPool& pool, Workspace& ws, const Tensor& logits, const SamplerParams& params,
                 const Tensor& uniforms, const Tensor& out);
void diffusion_sample_rows(ThreadPool& pool, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                           const Tensor& argmax, const Tensor& entropy, const Tensor& sampled);
void moe_route(ThreadPool& pool, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
               const Tensor& weights);
void matmul_id(ThreadPool& pool, Workspace& ws, const Tensor& W, const Tensor& x, const Tensor& ids,
               const Tensor& y);
void moe_combine(ThreadPool& pool, const Tensor& y, const Tensor& weights, const Tensor& out);

}  // namespace tandem::cpu
