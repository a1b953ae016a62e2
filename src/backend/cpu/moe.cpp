// CPU mixture-of-experts ops (backend.h): the router (softmax, top-k, renormalised weights), the expert
// matmul over routed rows, and the weighted sum over the selected experts.
//
// matmul_id groups the routed rows by expert first (a counting sort of the k * T (row, slot) pairs), then
// multiplies each expert's weights with its rows in tiles exactly like matmul (R weight rows x C routed rows,
// weight rows decoded once per 4 routed rows), so prefill reads each selected expert's weights once per 64
// rows and decode reads only the selected experts. Quantized weights use matmul's integer dot products
// against the 8-bit activations, read in place.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/cpu_ops_impl.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/op_checks.h"

namespace tandem::cpu {

namespace {
constexpr DeviceId kCpu{DeviceKind::CPU, 0};
constexpr float kMinWeightSum = 6.1035e-5f;  // C.5 step 5: the sum of the selected probabilities, clamped
}  // namespace

void moe_route(ThreadPool& pool, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
               const Tensor& weights) {
  op_checks::moe_route(logits, expert_scale, ids, weights, kCpu);
  const int64_t n_expert = logits.ne[0], T = logits.ne[1], k = ids.ne[0];
  int32_t* out_ids = ids.ptr<int32_t>();
  float* out_w = weights.ptr<float>();
  const float* scale = expert_scale ? expert_scale->ptr<float>() : nullptr;
  pool.parallel_for(T, [&](int64_t t, int) {
    const float* l = reinterpret_cast<const float*>(logits.row(t));
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
    float z = 0.0f;
    for (int64_t e = 0; e < n_expert; ++e) z += std::exp(l[e] - mx);
    // Top-k by repeated selection (k is small): the best remaining, ties to the lower index.
    int32_t* id = out_ids + t * k;
    float* w = out_w + t * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < n_expert; ++e) {
        bool taken = false;
        for (int64_t q = 0; q < j; ++q) taken |= id[q] == int32_t(e);
        if (!taken && (best < 0 || l[e] > l[best])) best = int32_t(e);
      }
      id[j] = best;
      w[j] = std::exp(l[best] - mx) / z;
      sum += w[j];
    }
    const float inv = 1.0f / std::max(sum, kMinWeightSum);
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] * inv * (scale ? scale[id[j]] : 1.0f);
  });
}

void matmul_id(ThreadPool& pool, Workspace& ws, const Tensor& W, const Tensor& x, const Tensor& ids,
               const Tensor& y) {
  op_checks::matmul_id(W, x, ids, y, kCpu);
  const MatmulKernels kern = matmul_kernels(W.type);
  const int64_t K = W.ne[0], N = W.ne[1], n_expert = W.ne[2];
  const int64_t k = ids.ne[0], T = ids.ne[1], kx = x.ne[1];
  const int64_t n_slots = k * T;
  if (n_slots == 0 || N == 0) return;
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t s = 0; s < n_slots; ++s)
    TANDEM_CPU_CHECK(id[s] >= 0 && id[s] < n_expert,
                     "matmul_id: ids[" + std::to_string(s % k) + ", " + std::to_string(s / k) +
                         "] = " + std::to_string(id[s]) + " is not an expert of W (0.." +
                         std::to_string(n_expert - 1) + ")");

  // Int scratch: slots sorted by expert, then each expert's first sorted index (n_expert + 1 entries), then
  // the prefix sum of column tiles per expert (n_expert + 1).
  size_t stride = 0;
  int32_t* scratch = ws.per_thread_i32(size_t(n_slots + 2 * (n_expert + 1)), 1, &stride);
  int32_t* sorted = scratch;
  int32_t* first = sorted + n_slots;
  int32_t* tile_start = first + n_expert + 1;
  std::fill(first, first + n_expert + 1, 0);
  for (int64_t s = 0; s < n_slots; ++s) ++first[id[s] + 1];
  for (int64_t e = 0; e < n_expert; ++e) first[e + 1] += first[e];
  for (int64_t e = 0; e < n_expert; ++e) tile_start[e] = first[e];  // fill cursors, reset below
  for (int64_t s = 0; s < n_slots; ++s) sorted[tile_start[id[s]]++] = int32_t(s);

  // Activations: each input row (k_x per token) in the kernel's format once.
  const size_t act_bytes = act_row_bytes(kern.act, K);
  const int64_t n_x = kx * T;
  auto x_row = [&](int64_t c) -> const float* {  // input row c = t * kx + j'
    return reinterpret_cast<const float*>(x.row(c % kx, c / kx));
  };
  const uint8_t* act = nullptr;
  if (kern.act != ActFormat::F32) {
    uint8_t* buf = ws.act(act_bytes * size_t(n_x));
    const int64_t per = items_per_task(n_x, pool.n_threads(), 1);
    pool.parallel_for((n_x + per - 1) / per, [&](int64_t task, int) {
      for (int64_t c = task * per; c < std::min(n_x, (task + 1) * per); ++c)
        kern.quantize(x_row(c), buf + size_t(c) * act_bytes, K);
    });
    act = buf;
  }
  auto act_of_slot = [&](int64_t s) -> const void* {
    const int64_t c = (s / k) * kx + (kx == 1 ? 0 : s % k);
    return act ? static_cast<const void*>(act + size_t(c) * act_bytes) : x_row(c);
  };

  // Tiles: R weight rows x C routed rows of one expert.
  const int64_t C = 64;
  tile_start[0] = 0;
  for (int64_t e = 0; e < n_expert; ++e)
    tile_start[e + 1] = tile_start[e] + int32_t((first[e + 1] - first[e] + C - 1) / C);
  const int64_t n_col_tiles = tile_start[n_expert];
  const size_t w_row_bytes = W.row_bytes();
  int64_t R = std::max<int64_t>(1, int64_t(32768 / std::max<size_t>(w_row_bytes, 1)));
  const int64_t min_tasks = int64_t(pool.n_threads()) * 4;
  R = std::min(R, std::max<int64_t>(1, (N * n_col_tiles + min_tasks - 1) / min_tasks));
  const int64_t n_row_tiles = (N + R - 1) / R;

  pool.parallel_for(n_row_tiles * n_col_tiles, [&](int64_t task, int) {
    const int64_t ct = task / n_row_tiles;
    const int64_t o0 = (task % n_row_tiles) * R, o1 = std::min(N, o0 + R);
    const int64_t e = std::upper_bound(tile_start, tile_start + n_expert + 1, int32_t(ct)) - tile_start - 1;
    const int64_t s0 = first[e] + (ct - tile_start[e]) * C, s1 = std::min<int64_t>(first[e + 1], s0 + C);
    const char* We = static_cast<const char*>(W.data) + size_t(e) * W.nb[2];
    const void* xs[kMaxDotRows];
    float* ys[kMaxDotRows];
    float res[kMaxDotRows];
    for (int64_t s = s0; s < s1; s += kMaxDotRows) {
      const int nx = int(std::min<int64_t>(kMaxDotRows, s1 - s));
      for (int j = 0; j < nx; ++j) {
        const int64_t slot = sorted[s + j];
        xs[j] = act_of_slot(slot);
        ys[j] = reinterpret_cast<float*>(y.row(slot % k, slot / k));
      }
      for (int64_t o = o0; o < o1; ++o) {
        kern.dot(K, We + size_t(o) * W.nb[1], xs, nx, res);
        for (int j = 0; j < nx; ++j) ys[j][o] = res[j];
      }
    }
  });
}

void moe_combine(ThreadPool& pool, const Tensor& y, const Tensor& weights, const Tensor& out) {
  op_checks::moe_combine(y, weights, out, kCpu);
  const int64_t n = y.ne[0], k = y.ne[1], T = y.ne[2];
  const float* w = weights.ptr<float>();
  pool.parallel_for(T, [&](int64_t t, int) {
    float* o = reinterpret_cast<float*>(out.row(t));
    for (int64_t i = 0; i < n; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float* r = reinterpret_cast<const float*>(y.row(j, t));
      const float wj = w[t * k + j];
      for (int64_t i = 0; i < n; ++i) o[i] += wj * r[i];
    }
  });
}

}  // namespace tandem::cpu
