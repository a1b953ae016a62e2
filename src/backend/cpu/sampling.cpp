// Per-row reductions over logits: argmax_rows, sample_rows (the SamplerParams chain, see backend.h) and
// diffusion_sample_rows (the entropy-bound sampler's reduction). Sums are in double: this is the reference
// the device versions are compared with.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_ops_impl.h"

namespace tandem::cpu {
namespace {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

void check_logits(const char* op, const Tensor& logits) {
  check_f32(op, "logits", logits);
  TANDEM_CPU_CHECK(
      logits.ne[2] == 1 && logits.ne[3] == 1 && logits.ne[0] > 0,
      std::string(op) + ": logits must be {n_vocab, T} with n_vocab > 0, got " + logits.shape_string());
}

// One row of sample_rows. idx: scratch of n ints.
int32_t sample_row(const float* x, int64_t n, const SamplerParams& sp, float u, int32_t* idx) {
  if (sp.temperature <= 0.0f) return argmax(x, n);
  // rank order: descending logit, ties by lower id
  auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  const int32_t best = argmax(x, n);  // rank 0
  const float max_logit = x[best];

  // The kept set is a best-ranked prefix, described by its last member `cutoff` (or every token).
  int64_t n_kept = n;
  int32_t cutoff = -1;  // -1: every token is kept
  const bool top_k_on = sp.top_k > 0 && sp.top_k < n;
  const bool top_p_on = sp.top_p < 1.0f;
  if (top_k_on || top_p_on) {
    std::iota(idx, idx + n, 0);
    if (top_k_on) {
      n_kept = sp.top_k;
      std::nth_element(idx, idx + n_kept - 1, idx + n, better);  // idx[0 .. k) = the k best, in any order
      if (top_p_on) std::sort(idx, idx + n_kept, better);
    } else {
      std::sort(idx, idx + n, better);
    }
    if (top_p_on) {
      double z = 0.0;
      for (int64_t i = 0; i < n_kept; ++i) z += std::exp(double(x[idx[i]]) - double(max_logit));
      const double target = double(sp.top_p) * z;
      double cum = 0.0;
      int64_t keep = n_kept;
      for (int64_t i = 0; i < n_kept; ++i) {
        cum += std::exp(double(x[idx[i]]) - double(max_logit));
        if (cum >= target) {
          keep = i + 1;
          break;
        }
      }
      n_kept = std::max<int64_t>(keep, 1);
    }
    cutoff = idx[n_kept - 1];
  }
  auto kept = [&](int32_t v) {
    if (cutoff >= 0 && better(cutoff, v)) return false;  // ranks below the cutoff
    return !(sp.min_p > 0.0f && std::exp(double(x[v]) - double(max_logit)) < double(sp.min_p));
  };

  const double inv_temp = 1.0 / double(sp.temperature);
  double total = 0.0;
  for (int64_t v = 0; v < n; ++v)
    if (kept(int32_t(v))) total += std::exp((double(x[v]) - double(max_logit)) * inv_temp);
  const double target = double(u) * total;
  double cum = 0.0;
  int32_t last = best;
  for (int64_t v = 0; v < n; ++v) {
    if (!kept(int32_t(v))) continue;
    cum += std::exp((double(x[v]) - double(max_logit)) * inv_temp);
    last = int32_t(v);
    if (cum > target) return int32_t(v);
  }
  return last;
}

}  // namespace

void argmax_rows(ThreadPool& pool, const Tensor& logits, const Tensor& out) {
  check_logits("argmax_rows", logits);
  const int64_t T = logits.ne[1], n = logits.ne[0];
  check_i32_vector("argmax_rows", "out", out, T);
  int32_t* o = out.ptr<int32_t>();
  pool.parallel_for(T,
                    [&](int64_t t, int) { o[t] = argmax(reinterpret_cast<const float*>(logits.row(t)), n); });
}

void sample_rows(ThreadPool& pool, Workspace& ws, const Tensor& logits, const SamplerParams& params,
                 const Tensor& uniforms, const Tensor& out) {
  const char* op = "sample_rows";
  check_logits(op, logits);
  const int64_t T = logits.ne[1], n = logits.ne[0];
  check_f32(op, "uniforms", uniforms);
  TANDEM_CPU_CHECK(
      uniforms.ne[0] == T && uniforms.nrows() == 1,
      "sample_rows: uniforms must be {T = " + std::to_string(T) + "}, got " + uniforms.shape_string());
  check_i32_vector(op, "out", out, T);
  TANDEM_CPU_CHECK(std::isfinite(params.temperature), "sample_rows: temperature must be finite");
  TANDEM_CPU_CHECK(params.top_k >= 0, "sample_rows: top_k must be >= 0");
  TANDEM_CPU_CHECK(params.top_p > 0.0f && params.top_p <= 1.0f, "sample_rows: top_p must be in (0, 1]");
  TANDEM_CPU_CHECK(params.min_p >= 0.0f && params.min_p <= 1.0f, "sample_rows: min_p must be in [0, 1]");
  const float* u = uniforms.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    TANDEM_CPU_CHECK(u[t] >= 0.0f && u[t] < 1.0f,
                     "sample_rows: uniforms[" + std::to_string(t) + "] must be in [0, 1)");
  size_t stride = 0;
  int32_t* idx_all = ws.per_thread_i32(size_t(n), pool.n_threads(), &stride);
  int32_t* o = out.ptr<int32_t>();
  pool.parallel_for(T, [&](int64_t t, int tid) {
    o[t] = sample_row(reinterpret_cast<const float*>(logits.row(t)), n, params, u[t],
                      idx_all + size_t(tid) * stride);
  });
}

void diffusion_sample_rows(ThreadPool& pool, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                           const Tensor& argmax_out, const Tensor& entropy, const Tensor& sampled) {
  const char* op = "diffusion_sample_rows";
  check_logits(op, logits);
  const int64_t T = logits.ne[1], n = logits.ne[0];
  check_f32(op, "uniforms", uniforms);
  TANDEM_CPU_CHECK(uniforms.ne[0] == T && uniforms.nrows() == 1,
                   "diffusion_sample_rows: uniforms must be {T}");
  check_i32_vector(op, "argmax", argmax_out, T);
  check_i32_vector(op, "sampled", sampled, T);
  check_f32(op, "entropy", entropy);
  TANDEM_CPU_CHECK(entropy.ne[0] == T && entropy.nrows() == 1, "diffusion_sample_rows: entropy must be {T}");
  TANDEM_CPU_CHECK(inv_temp > 0.0f && std::isfinite(inv_temp),
                   "diffusion_sample_rows: inv_temp must be a finite value > 0");
  const float* u = uniforms.ptr<float>();
  int32_t* am = argmax_out.ptr<int32_t>();
  int32_t* smp = sampled.ptr<int32_t>();
  float* ent = entropy.ptr<float>();
  pool.parallel_for(T, [&](int64_t t, int) {
    const float* x = reinterpret_cast<const float*>(logits.row(t));
    // z_v = x_v * inv_temp in f32 (as the sampler defines it), the sums in double
    int32_t best = 0;
    float m = x[0] * inv_temp;
    for (int64_t v = 1; v < n; ++v) {
      const float z = x[v] * inv_temp;
      if (z > m) m = z, best = int32_t(v);
    }
    double zsum = 0.0, tz = 0.0;
    for (int64_t v = 0; v < n; ++v) {
      const double d = double(x[v] * inv_temp) - double(m);
      const double e = std::exp(d);
      zsum += e;
      tz += d * e;
    }
    const double target = double(u[t]) * zsum;
    double cum = 0.0;
    int32_t pick = int32_t(n - 1);
    for (int64_t v = 0; v < n; ++v) {
      cum += std::exp(double(x[v] * inv_temp) - double(m));
      if (cum >= target) {
        pick = int32_t(v);
        break;
      }
    }
    const double z = zsum;
    am[t] = best;
    ent[t] = float(std::log(z) - tz / z);
    smp[t] = pick;
  });
}

}  // namespace tandem::cpu
