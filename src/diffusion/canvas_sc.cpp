#include "diffusion/canvas_sc.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem {

namespace {

// A whole file tensor dequantized to f32 (rows of ne[0]); checks its element count.
std::vector<float> dequantized(const gguf::GgufFile& file, const std::string& name, int64_t n) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  check(t != nullptr, file.path() + ": missing tensor " + name);
  int64_t count = 1;
  for (int64_t d : t->ne) count *= d;
  check(count == n,
        "tensor " + name + " has " + std::to_string(count) + " values, expected " + std::to_string(n));
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t row = t->ne[0];
  const uint8_t* src = file.tensor_data(*t);
  const size_t row_bytes = dtype_row_bytes(t->type, row);
  for (int64_t r = 0; r < n / row; ++r)
    quant::dequantize_row(t->type, src + size_t(r) * row_bytes, out.data() + size_t(r * row), row);
  return out;
}

double gelu_tanh(double z) {
  return 0.5 * z * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (z + 0.044715 * z * z * z)));
}

}  // namespace

std::vector<float> sc_token_rows(const gguf::GgufFile& file, int64_t n_embd, int64_t n_vocab, bool* is_f32) {
  const gguf::TensorInfo* t = file.find_tensor("token_embd.weight");
  check(t != nullptr && t->n_dims == 2 && t->ne[0] == n_embd && t->ne[1] == n_vocab,
        file.path() + ": token_embd.weight is missing or not {n_embd, n_vocab}");
  *is_f32 = t->type == DType::F32;
  std::vector<float> out(static_cast<size_t>(n_embd * n_vocab));
  const size_t row_bytes = dtype_row_bytes(t->type, n_embd);
  const uint8_t* src = file.tensor_data(*t);
  for (int64_t v = 0; v < n_vocab; ++v) {
    float* row = out.data() + size_t(v * n_embd);
    quant::dequantize_row(t->type, src + size_t(v) * row_bytes, row, n_embd);
    if (!*is_f32)
      for (int64_t e = 0; e < n_embd; ++e) row[e] = fp16_to_fp32(fp32_to_fp16(row[e]));
  }
  return out;
}

HostSelfCond::HostSelfCond(const gguf::GgufFile& file, int64_t n_embd, int64_t n_vocab, float eps)
    : E_(n_embd), V_(n_vocab), eps_(eps) {
  const gguf::TensorInfo* g = file.find_tensor("self_cond_gate.weight");
  check(g != nullptr && g->n_dims == 2, file.path() + ": the model has no self-conditioning tensors");
  F_ = g->ne[1];
  bool f32 = false;
  emb_ = sc_token_rows(file, E_, V_, &f32);
  pre_norm_ = dequantized(file, "self_cond_pre_norm.weight", E_);
  gate_ = dequantized(file, "self_cond_gate.weight", E_ * F_);
  up_ = dequantized(file, "self_cond_up.weight", E_ * F_);
  down_ = dequantized(file, "self_cond_down.weight", E_ * F_);
}

void HostSelfCond::compute(std::span<const float> logits, int64_t C, float temp_inv,
                           std::span<float> out) const {
  check(int64_t(logits.size()) == V_ * C && int64_t(out.size()) == E_ * C, "internal: host SC sizes");
  std::vector<double> p(static_cast<size_t>(V_)), soft(static_cast<size_t>(E_)), act(static_cast<size_t>(F_));
  for (int64_t c = 0; c < C; ++c) {
    const float* l = logits.data() + size_t(c * V_);
    double mx = -INFINITY;
    for (int64_t v = 0; v < V_; ++v) mx = std::max(mx, double(l[v] * temp_inv));
    double z = 0;
    for (int64_t v = 0; v < V_; ++v) z += (p[size_t(v)] = std::exp(double(l[v] * temp_inv) - mx));
    std::fill(soft.begin(), soft.end(), 0.0);
    for (int64_t v = 0; v < V_; ++v) {
      const double pv = p[size_t(v)] / z;
      const float* row = emb_.data() + size_t(v * E_);
      for (int64_t e = 0; e < E_; ++e) soft[size_t(e)] += pv * double(row[e]);
    }
    double ss = 0;
    for (double& s : soft) {
      s *= double(std::sqrt(float(E_)));
      ss += s * s;
    }
    const double inv = 1.0 / std::sqrt(ss / double(E_) + eps_);
    for (int64_t e = 0; e < E_; ++e) soft[size_t(e)] *= inv * double(pre_norm_[size_t(e)]);
    for (int64_t f = 0; f < F_; ++f) {
      double g = 0, u = 0;
      for (int64_t e = 0; e < E_; ++e) {
        g += double(gate_[size_t(f * E_ + e)]) * soft[size_t(e)];
        u += double(up_[size_t(f * E_ + e)]) * soft[size_t(e)];
      }
      act[size_t(f)] = gelu_tanh(g) * u;
    }
    float* o = out.data() + size_t(c * E_);
    for (int64_t e = 0; e < E_; ++e) {
      double s = 0;
      for (int64_t f = 0; f < F_; ++f) s += double(down_[size_t(e * F_ + f)]) * act[size_t(f)];
      o[e] = float(s);
    }
  }
}

DeviceSelfCond::DeviceSelfCond(Device& device, const gguf::GgufFile& file, const SelfCondWeights& w,
                               int64_t n_embd, int64_t n_vocab, int64_t C, float eps)
    : device_(device), ops_(device.ops()), w_(w), E_(n_embd), V_(n_vocab), C_(C), eps_(eps) {
  const int64_t F = w.n_ff;
  constexpr size_t kAlign = 256;
  auto padded = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  bool f32 = false;
  const std::vector<float> rows = sc_token_rows(file, E_, V_, &f32);
  const size_t el = f32 ? 4 : 2;
  const size_t emb_bytes = padded(size_t(V_ * E_) * el);
  const size_t f32_counts[] = {size_t(V_ * C_), size_t(V_ * C_), size_t(E_ * C_), size_t(F * C_),
                               size_t(F * C_),  size_t(F * C_),  size_t(E_ * C_)};
  size_t total = emb_bytes;
  for (size_t n : f32_counts) total += padded(n * 4);
  mem_ = device.allocate(total);
  char* p = static_cast<char*>(mem_.data());
  const DeviceId id = device.id();
  emb_t_ = Tensor::contiguous(f32 ? DType::F32 : DType::F16, {V_, E_}, p, id);
  p += emb_bytes;
  Tensor* bufs[] = {&logits_, &probs_, &soft_, &gate_, &up_, &act_, &out_};
  const int64_t widths[] = {V_, V_, E_, F, F, F, E_};
  for (size_t i = 0; i < std::size(bufs); ++i) {
    *bufs[i] = Tensor::contiguous(DType::F32, {widths[i], C_}, p, id);
    p += padded(f32_counts[i] * 4);
  }
  // sc_embT: the F16-rounded embedding transposed, so that soft = sc_embT . p is one matmul over the vocab.
  {
    std::vector<uint8_t> t(rows.size() * el);
    // In tiles, so that both sides stay in cache: a 262144 x 2816 table took 84 s row by row, 5 s in tiles
    // (measured on a loaded 2-core machine).
    constexpr int64_t kTile = 64;
    for (int64_t v0 = 0; v0 < V_; v0 += kTile)
      for (int64_t e0 = 0; e0 < E_; e0 += kTile)
        for (int64_t e = e0; e < std::min(E_, e0 + kTile); ++e)
          for (int64_t v = v0; v < std::min(V_, v0 + kTile); ++v) {
            const float x = rows[size_t(v * E_ + e)];
            const size_t at = size_t(e * V_ + v) * el;
            if (f32) {
              std::memcpy(t.data() + at, &x, 4);
            } else {
              const uint16_t h = fp32_to_fp16(x);
              std::memcpy(t.data() + at, &h, 2);
            }
          }
    Stream& st = device.default_stream();
    device.copy_from_host(st, emb_t_.data, t.data(), t.size());
    st.synchronize();  // t is freed on return
  }
  WorkspacePlan plan;
  plan.max_rows = C_;
  plan.max_matmul_in = std::max({V_, E_, F});
  plan.max_vocab = V_;
  ops_.reserve(plan);
  reset(device.default_stream());
}

void DeviceSelfCond::reset(Stream& st) {
  ops_.fill(st, logits_, 0.0f);
}

void DeviceSelfCond::compute(Stream& st, float temp_inv) {
  ops_.scale(st, logits_, temp_inv, probs_);
  ops_.softmax_rows(st, probs_, probs_);
  ops_.matmul(st, emb_t_, probs_, soft_);
  ops_.scale(st, soft_, std::sqrt(float(E_)), soft_);
  ops_.rms_norm(st, soft_, &w_.pre_norm, eps_, soft_);
  ops_.matmul(st, w_.gate, soft_, gate_);
  ops_.matmul(st, w_.up, soft_, up_);
  ops_.gelu_mul(st, gate_, up_, act_);
  ops_.matmul(st, w_.down, act_, out_);
}

}  // namespace tandem
