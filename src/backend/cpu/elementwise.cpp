// Elementwise and row-copy ops: activations, add/mul/scale/softcap/fill, dtype copies, get_rows, embed_rows,
// kv_store.
// These are memory-bound; plain loops (auto-vectorised at the baseline ISA) are enough. Work is split over
// rows.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops_impl.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem::cpu {
namespace {

// Runs f(r) for every row r in [0, rows), rows in tasks of about 16K elements.
template <class F>
void for_rows(ThreadPool& pool, int64_t rows, int64_t n, F&& f) {
  if (rows == 0 || n == 0) return;
  const int64_t per = items_per_task(rows, pool.n_threads(), std::max<int64_t>(1, 16384 / n));
  pool.parallel_for((rows + per - 1) / per, [&](int64_t task, int) {
    for (int64_t r = task * per; r < std::min(rows, (task + 1) * per); ++r) f(r);
  });
}

inline float* frow(const Tensor& t, int64_t r) {
  return reinterpret_cast<float*>(row_ptr(t, r));
}

template <class F>
void binary_glu(ThreadPool& pool, const char* op, const Tensor& gate, const Tensor& up, const Tensor& out,
                F act) {
  check_f32(op, "gate", gate);
  check_f32(op, "up", up);
  check_f32(op, "out", out);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "out", out);
  const int64_t n = gate.ne[0];
  for_rows(pool, gate.nrows(), n, [&](int64_t r) {
    const float* g = frow(gate, r);
    const float* u = frow(up, r);
    float* o = frow(out, r);
    for (int64_t i = 0; i < n; ++i) o[i] = act(g[i]) * u[i];
  });
}

template <class F>
void binary_broadcast(ThreadPool& pool, const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                      F f) {
  check_f32(op, "a", a);
  check_f32(op, "b", b);
  check_f32(op, "out", out);
  check_same_shape(op, "a", a, "out", out);
  const bool one_row = b.ne[0] == a.ne[0] && b.nrows() == 1;
  TANDEM_CPU_CHECK(one_row || b.ne == a.ne, std::string(op) + ": b " + b.shape_string() +
                                                " must have a's shape " + a.shape_string() +
                                                " or be one row {" + std::to_string(a.ne[0]) + "}");
  const int64_t n = a.ne[0];
  for_rows(pool, a.nrows(), n, [&](int64_t r) {
    const float* x = frow(a, r);
    const float* y = frow(b, one_row ? 0 : r);
    float* o = frow(out, r);
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
  });
}

template <class F>
void unary(ThreadPool& pool, const char* op, const Tensor& x, const Tensor& out, F f) {
  check_f32(op, "x", x);
  check_f32(op, "out", out);
  check_same_shape(op, "x", x, "out", out);
  const int64_t n = x.ne[0];
  for_rows(pool, x.nrows(), n, [&](int64_t r) {
    const float* xi = frow(x, r);
    float* o = frow(out, r);
    for (int64_t i = 0; i < n; ++i) o[i] = f(xi[i]);
  });
}

// Converts n f32 values to a row of type t (F32, F16 or BF16).
void store_row(DType t, void* dst, const float* src, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_fp16(src[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_bf16(src[i]);
      return;
    default:
      throw Error(std::string("cannot convert f32 to ") + dtype_name(t));
  }
}

// Converts a row of n values of type t to f32 (any supported weight type).
void load_row(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(static_cast<const uint16_t*>(src)[i]);
      return;
    default:
      quant::dequantize_row(t, src, dst, n);
  }
}

bool is_float_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

void silu_mul(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out) {
  binary_glu(pool, "silu_mul", gate, up, out, [](float x) { return x / (1.0f + std::exp(-x)); });
}

void gelu_mul(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out) {
  binary_glu(pool, "gelu_mul", gate, up, out, [](float x) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  });
}

void add(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_broadcast(pool, "add", a, b, out, [](float x, float y) { return x + y; });
}

void mul(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_broadcast(pool, "mul", a, b, out, [](float x, float y) { return x * y; });
}

void scale(ThreadPool& pool, const Tensor& x, float factor, const Tensor& out) {
  unary(pool, "scale", x, out, [factor](float v) { return v * factor; });
}

void softcap(ThreadPool& pool, const Tensor& x, float cap, const Tensor& out) {
  TANDEM_CPU_CHECK(cap > 0.0f && std::isfinite(cap), "softcap: cap must be a finite value > 0");
  const float inv = 1.0f / cap;
  unary(pool, "softcap", x, out, [cap, inv](float v) { return cap * std::tanh(v * inv); });
}

void fill(ThreadPool& pool, const Tensor& out, float value) {
  check_f32("fill", "out", out);
  const int64_t n = out.ne[0];
  for_rows(pool, out.nrows(), n, [&](int64_t r) { std::fill_n(frow(out, r), n, value); });
}

void copy(ThreadPool& pool, const Tensor& src, const Tensor& dst) {
  const char* op = "copy";
  check_on_cpu(op, "src", src);
  check_on_cpu(op, "dst", dst);
  check_same_shape(op, "src", src, "dst", dst);
  TANDEM_CPU_CHECK(src.nb[0] == dtype_block_bytes(src.type) && dst.nb[0] == dtype_block_bytes(dst.type),
                   "copy: src and dst must have contiguous rows");
  const int64_t n = src.ne[0];
  if (src.type == dst.type) {
    const size_t bytes = src.row_bytes();
    for_rows(pool, src.nrows(), n, [&](int64_t r) { std::memcpy(row_ptr(dst, r), row_ptr(src, r), bytes); });
    return;
  }
  TANDEM_CPU_CHECK(is_float_type(src.type) && is_float_type(dst.type),
                   std::string("copy: cannot convert ") + dtype_name(src.type) + " to " +
                       dtype_name(dst.type) + " (only f32 <-> f16 / bf16, or a copy within one type)");
  if (src.type == DType::F32) {
    for_rows(pool, src.nrows(), n, [&](int64_t r) { store_row(dst.type, row_ptr(dst, r), frow(src, r), n); });
  } else if (dst.type == DType::F32) {
    for_rows(pool, src.nrows(), n, [&](int64_t r) { load_row(src.type, row_ptr(src, r), frow(dst, r), n); });
  } else {  // f16 <-> bf16 through f32, exact on the f32 side
    for_rows(pool, src.nrows(), n, [&](int64_t r) {
      const auto* s = reinterpret_cast<const uint16_t*>(row_ptr(src, r));
      auto* d = reinterpret_cast<uint16_t*>(row_ptr(dst, r));
      for (int64_t i = 0; i < n; ++i)
        d[i] = src.type == DType::F16 ? fp32_to_bf16(fp16_to_fp32(s[i])) : fp32_to_fp16(bf16_to_fp32(s[i]));
    });
  }
}

void get_rows(ThreadPool& pool, const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "get_rows";
  check_on_cpu(op, "table", table);
  TANDEM_CPU_CHECK(table.ne[2] == 1 && table.ne[3] == 1,
                   "get_rows: table must be {n_embd, n_rows}, got " + table.shape_string());
  TANDEM_CPU_CHECK(table.nb[0] == dtype_block_bytes(table.type), "get_rows: table must have contiguous rows");
  const int64_t n = table.ne[0], n_vocab = table.ne[1];
  check_i32_vector(op, "ids", ids, ids.ne[0]);
  const int64_t T = ids.ne[0];
  check_f32(op, "out", out);
  check_dims(op, "out", out, n, T);
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    TANDEM_CPU_CHECK(id[t] >= 0 && id[t] < n_vocab, "get_rows: id " + std::to_string(id[t]) + " at row " +
                                                        std::to_string(t) + " is out of range [0, " +
                                                        std::to_string(n_vocab) + ")");
  for_rows(pool, T, n, [&](int64_t t) { load_row(table.type, table.row(id[t]), frow(out, t), n); });
}

void embed_rows(ThreadPool& pool, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                const Tensor* added_ids, const Tensor& out) {
  const char* op = "embed_rows";
  check_on_cpu(op, "table", table);
  TANDEM_CPU_CHECK(table.ne[2] == 1 && table.ne[3] == 1,
                   "embed_rows: table must be {n_embd, n_rows}, got " + table.shape_string());
  TANDEM_CPU_CHECK(table.nb[0] == dtype_block_bytes(table.type),
                   "embed_rows: table must have contiguous rows");
  const int64_t n = table.ne[0], n_vocab = table.ne[1];
  check_i32_vector(op, "ids", ids, ids.ne[0]);
  const int64_t T = ids.ne[0];
  check_f32(op, "out", out);
  check_dims(op, "out", out, n, T);
  int64_t n_added = 0;
  if (added) {
    check_f32(op, "added", *added);
    TANDEM_CPU_CHECK(added->ne[0] == n && added->ne[2] == 1 && added->ne[3] == 1,
                     "embed_rows: added must be {n_embd = " + std::to_string(n) + ", n_added}, got " +
                         added->shape_string());
    n_added = added->ne[1];
    TANDEM_CPU_CHECK(added_ids != nullptr, "embed_rows: added is given, added_ids must be too");
    check_i32_vector(op, "added_ids", *added_ids, T);
  }
  const int32_t* id = ids.ptr<int32_t>();
  const int32_t* aid = added ? added_ids->ptr<int32_t>() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    TANDEM_CPU_CHECK(id[t] >= -1 && id[t] < n_vocab, "embed_rows: id " + std::to_string(id[t]) + " at row " +
                                                         std::to_string(t) + " is out of range [0, " +
                                                         std::to_string(n_vocab) + ") and not -1 (no token)");
    if (aid)
      TANDEM_CPU_CHECK(aid[t] >= -1 && aid[t] < n_added,
                       "embed_rows: added_ids " + std::to_string(aid[t]) + " at row " + std::to_string(t) +
                           " is out of range [0, " + std::to_string(n_added) +
                           ") and not -1 (nothing added)");
  }
  for_rows(pool, T, n, [&](int64_t t) {
    float* o = frow(out, t);
    if (id[t] >= 0) {
      load_row(table.type, table.row(id[t]), o, n);
      // The product is rounded to f32 before the sum below (separate statements, no fused multiply-add).
      if (scale != 1.0f)
        for (int64_t i = 0; i < n; ++i) o[i] = o[i] * scale;
    } else {
      std::fill_n(o, n, 0.0f);
    }
    if (aid && aid[t] >= 0) {
      const float* a = frow(*added, aid[t]);
      for (int64_t i = 0; i < n; ++i) o[i] = o[i] + a[i];
    }
  });
}

void kv_store(ThreadPool& pool, const KvLayerView& kv, const Tensor& k, const Tensor& v,
              const Tensor& slot_mapping) {
  const char* op = "kv_store";
  check_on_cpu(op, "kv.k", kv.k);
  check_on_cpu(op, "kv.v", kv.v);
  TANDEM_CPU_CHECK(is_float_type(kv.k.type) && is_float_type(kv.v.type),
                   "kv_store: the cache must be f32, f16 or bf16");
  TANDEM_CPU_CHECK(kv.k.is_contiguous() && kv.v.is_contiguous(),
                   "kv_store: the cache tensors must be contiguous");
  const int64_t hd_k = kv.k.ne[0], n_kv = kv.k.ne[1], bs = kv.k.ne[2], n_blocks = kv.k.ne[3];
  TANDEM_CPU_CHECK(kv.block_size == bs && bs > 0, "kv_store: kv.block_size " + std::to_string(kv.block_size) +
                                                      " must equal kv.k.ne[2] = " + std::to_string(bs));
  const int64_t hd_v = kv.v.ne[0];
  check_dims(op, "kv.v", kv.v, hd_v, n_kv, bs, n_blocks);
  check_f32(op, "k", k);
  check_f32(op, "v", v);
  const int64_t T = k.ne[2];
  check_dims(op, "k", k, hd_k, n_kv, T);
  check_dims(op, "v", v, hd_v, n_kv, T);
  check_i32_vector(op, "slot_mapping", slot_mapping, T);
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  const int64_t n_slots = bs * n_blocks;
  for (int64_t t = 0; t < T; ++t)
    TANDEM_CPU_CHECK(slots[t] < n_slots, "kv_store: slot " + std::to_string(slots[t]) + " of row " +
                                             std::to_string(t) + " is beyond the cache (" +
                                             std::to_string(n_slots) + " slots)");
  for_rows(pool, T * n_kv, hd_k + hd_v, [&](int64_t r) {
    const int64_t t = r / n_kv, h = r % n_kv;
    const int64_t s = slots[t];
    if (s < 0) return;
    const int64_t o = s % bs, b = s / bs;
    store_row(kv.k.type, static_cast<char*>(kv.k.data) + h * kv.k.nb[1] + o * kv.k.nb[2] + b * kv.k.nb[3],
              reinterpret_cast<const float*>(static_cast<const char*>(k.data) + h * k.nb[1] + t * k.nb[2]),
              hd_k);
    store_row(kv.v.type, static_cast<char*>(kv.v.data) + h * kv.v.nb[1] + o * kv.v.nb[2] + b * kv.v.nb[3],
              reinterpret_cast<const float*>(static_cast<const char*>(v.data) + h * v.nb[1] + t * v.nb[2]),
              hd_v);
  });
}

}  // namespace tandem::cpu
