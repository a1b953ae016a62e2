// `tandem bench --kernels` (bench.h): the CUDA (or CPU) kernels alone, timed on the shapes of the model (or
// of Qwen3-8B without -m): the matrix-vector products per weight dtype, the prefill matmul, and attention,
// each with the bytes it must move and the FLOPs it does, for the report to set against the limits.
#include <algorithm>
#include <functional>
#include <random>
#include <tuple>
#include <utility>

#include "bench.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem::cli::bench {
namespace {

// Median time per call of fn() over `iters` calls per sample, 5 samples, after a warm-up.
template <class F>
double time_calls(Device& dev, int iters, F&& fn) {
  fn(0);
  dev.synchronize();
  std::vector<double> samples;
  for (int s = 0; s < 5; ++s) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    dev.synchronize();
    samples.push_back(seconds_since(t0) / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// A recording key no earlier measurement of this process used. (Not a static inside the template below: each
// instantiation, one per group's lambda type, had its own counter, so the swiglu group's first key was the
// matmul group's first key, and the device replayed the matmul recording, whose weights were freed: the
// illegal memory access of `bench --kernels`, found by compute-sanitizer, 2026-12-05.)
uint64_t next_recording_key() {
  static uint64_t next = 0x6b65726e656c0000ull;  // "kernel"
  return next++;
}

// The same, with the `iters` calls replayed as one recording (Device::run_recorded: a CUDA graph), so that the
// host's launch cost between calls is not in the time; 0 where the device does not record (the CPU). Each
// measurement has its own key: a recording must always enqueue the same work. time_calls times one replay a
// sample (its warm-up records it).
template <class F>
double time_calls_recorded(Device& dev, int iters, F&& fn) {
  if (dev.id().kind != DeviceKind::CUDA) return 0.0;
  const uint64_t key = next_recording_key();
  const std::function<void(Stream&)> body = [&](Stream&) {
    for (int i = 0; i < iters; ++i) fn(i);
  };
  return time_calls(dev, 1, [&](int) { dev.run_recorded(dev.default_stream(), key, body); }) / iters;
}

// A device matrix {K, N} of dtype t from random values, replicated `copies` times so that rotating through
// the copies keeps the working set far larger than the L2 cache.
struct DeviceMatrix {
  Buffer buf;
  std::vector<Tensor> copies;
};
DeviceMatrix make_matrix(Device& dev, DType t, int64_t K, int64_t N, int copies,
                         const std::vector<float>& src) {
  const size_t row = dtype_row_bytes(t, K), bytes = row * size_t(N);
  std::vector<uint8_t> host(bytes);
  quant::quantize_matrix(t, src.data(), host.data(), N, K, 0);
  DeviceMatrix m;
  const size_t stride = (bytes + 255) / 256 * 256;
  m.buf = dev.allocate(stride * size_t(copies));
  for (int c = 0; c < copies; ++c) {
    char* p = static_cast<char*>(m.buf.data()) + stride * size_t(c);
    dev.copy_from_host(dev.default_stream(), p, host.data(), bytes);
    m.copies.push_back(Tensor::contiguous(t, {K, N}, p, dev.id()));
  }
  dev.synchronize();
  return m;
}

Buffer device_floats(Device& dev, size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : v) x = d(rng);
  Buffer b = dev.allocate(n * 4);
  dev.copy_from_host(dev.default_stream(), b.data(), v.data(), n * 4);
  dev.synchronize();
  return b;
}

}  // namespace

std::vector<KernelResult> bench_kernels(Device& dev, const ModelShape& shape, const std::string& only) {
  std::vector<KernelResult> out;
  auto wanted = [&](const char* group) { return only.empty() || only == group; };
  std::mt19937 rng(42);
  Ops& ops = dev.ops();
  Stream& s = dev.default_stream();
  const bool gpu = dev.id().kind == DeviceKind::CUDA;
  const int64_t E = shape.n_embd, F = shape.n_ff, P = 512;
  WorkspacePlan plan;
  plan.max_rows = P;
  plan.max_matmul_in = std::max(E, F);
  plan.max_head_dim = shape.head_dim;
  plan.max_n_head = shape.n_head;
  plan.max_seq_len = 4096;
  plan.max_vocab = shape.n_vocab;
  ops.reserve(plan);
  Buffer xb = device_floats(dev, size_t(std::max(E, F) * P), rng);
  Buffer yb = dev.allocate(size_t(std::max(E, F) * P) * 4);
  const int copies = gpu ? 8 : 1;

  // Matrix-vector (decode) per weight dtype, on the FFN matrices {E, F} (gate/up) and {F, E} (down).
  const DType types[] = {DType::BF16, DType::F16,  DType::Q8_0, DType::Q6_K,
                         DType::Q5_K, DType::Q4_K, DType::Q4_0};
  std::vector<float> src(static_cast<size_t>(E * F));
  {
    std::uniform_real_distribution<float> d(-0.05f, 0.05f);
    for (auto& v : src) v = d(rng);
  }
  for (DType t : types) {
    if (!wanted("matmul")) break;
    for (const auto& shape : {std::pair<int64_t, int64_t>{E, F}, {F, E}}) {
      // (not a structured binding: lambdas below use K and N, which clang before 16 cannot capture)
      const int64_t K = shape.first, N = shape.second;
      if (K % dtype_block_size(t) != 0) continue;
      DeviceMatrix m = make_matrix(dev, t, K, N, copies, src);
      // One product of T activation rows, timed over n_calls calls that rotate through the weight copies.
      auto time_matmul = [&](int64_t T, int n_calls) {
        Tensor x = Tensor::contiguous(DType::F32, {K, T}, xb.data(), dev.id());
        Tensor y = Tensor::contiguous(DType::F32, {N, T}, yb.data(), dev.id());
        KernelResult r;
        auto call = [&](int i) { ops.matmul(s, m.copies[size_t(i % copies)], x, y); };
        r.seconds = time_calls(dev, n_calls, call);
        r.graph_seconds = time_calls_recorded(dev, n_calls, call);
        r.name = std::string("matmul ") + dtype_name(t) + " {" + std::to_string(K) + ", " +
                 std::to_string(N) + "} T=" + std::to_string(T);
        r.bytes = double(m.copies[0].nbytes()) + double(K * T * 4 + N * T * 4);
        r.flops = 2.0 * double(K) * double(N) * double(T);
        out.push_back(r);
      };
      for (int64_t T : {int64_t(1), int64_t(8), int64_t(32)}) time_matmul(T, gpu ? 40 : 2);
      if (t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_K) time_matmul(P, gpu ? 10 : 1);  // prefill
    }
  }

  // Fused gate + up with SwiGLU in the epilogue (Ops::matmul_swiglu), T = 1 and 8: the first half of a decode
  // step's FFN in one launch (issue 19).
  for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_K}) {
    if (!wanted("swiglu")) break;
    DeviceMatrix g = make_matrix(dev, t, E, F, copies, src), u = make_matrix(dev, t, E, F, copies, src);
    Buffer tmp = dev.allocate(size_t(F) * 4 * 3 * 8);
    char* base = static_cast<char*>(tmp.data());
    for (int64_t T : {int64_t(1), int64_t(8)}) {
      const Tensor x = Tensor::contiguous(DType::F32, {E, T}, xb.data(), dev.id());
      const Tensor gate = Tensor::contiguous(DType::F32, {F, T}, base, dev.id());
      const Tensor up = Tensor::contiguous(DType::F32, {F, T}, base + F * T * 4, dev.id());
      const Tensor act = Tensor::contiguous(DType::F32, {F, T}, base + 2 * F * T * 4, dev.id());
      KernelResult r;
      auto call = [&](int i) {
        ops.matmul_swiglu(s, g.copies[size_t(i % copies)], u.copies[size_t(i % copies)], x, gate, up, act);
      };
      r.seconds = time_calls(dev, gpu ? 40 : 2, call);
      r.graph_seconds = time_calls_recorded(dev, gpu ? 40 : 2, call);
      r.name = std::string("matmul_swiglu ") + dtype_name(t) + " 2 x {" + std::to_string(E) + ", " +
               std::to_string(F) + "} T=" + std::to_string(T);
      r.bytes = 2.0 * double(g.copies[0].nbytes()) + double(E * T * 4 + F * T * 4);
      r.flops = 4.0 * double(E) * double(F) * double(T);
      out.push_back(r);
    }
  }

  // Attention: decode over a 4096-, 8192- and 32768-position cache (1 sequence; issue 19's depth goals) and a
  // 1024-position cache (32 sequences), and a 512-row causal prefill.
  const int64_t hd = shape.head_dim, nh = shape.n_head, nkv = shape.n_head_kv, bs = 16;
  for (auto [n_seq, ctx, rows_per_seq] :
       {std::tuple<int, int, int>{1, 4096, 1}, {1, 8192, 1}, {1, 32768, 1}, {32, 1024, 1}, {1, 512, 512}}) {
    if (!wanted("attention")) break;
    if (!gpu && ctx > 4096) continue;  // (the CPU's rows would take minutes; the depth goals are the GPU's)
    const int64_t blocks_per_seq = (ctx + bs - 1) / bs, n_blocks = blocks_per_seq * n_seq;
    const int64_t T = int64_t(n_seq) * rows_per_seq;
    Buffer kc = dev.allocate(size_t(hd * nkv * bs * n_blocks) * 2),
           vc = dev.allocate(size_t(hd * nkv * bs * n_blocks) * 2);
    {
      std::vector<uint16_t> h(static_cast<size_t>(hd * nkv * bs * n_blocks));
      std::uniform_real_distribution<float> d(-1, 1);
      for (auto& v : h) v = fp32_to_fp16(d(rng));
      dev.copy_from_host(s, kc.data(), h.data(), h.size() * 2);
      dev.copy_from_host(s, vc.data(), h.data(), h.size() * 2);
      dev.synchronize();
    }
    std::vector<int32_t> pos(static_cast<size_t>(T)), seq(static_cast<size_t>(T));
    std::vector<int32_t> tables(static_cast<size_t>(blocks_per_seq * n_seq)),
        lens(static_cast<size_t>(n_seq), ctx);
    for (int q = 0; q < n_seq; ++q)
      for (int r = 0; r < rows_per_seq; ++r) {
        pos[size_t(q * rows_per_seq + r)] = ctx - rows_per_seq + r;
        seq[size_t(q * rows_per_seq + r)] = q;
      }
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
    auto upload_i32 = [&](const std::vector<int32_t>& v) {
      Buffer b = dev.allocate(v.size() * 4);
      dev.copy_from_host(s, b.data(), v.data(), v.size() * 4);
      return b;
    };
    Buffer bpos = upload_i32(pos), bseq = upload_i32(seq), btab = upload_i32(tables), blen = upload_i32(lens);
    dev.synchronize();
    KvLayerView kv;
    kv.k = Tensor::contiguous(DType::F16, {hd, nkv, bs, n_blocks}, kc.data(), dev.id());
    kv.v = Tensor::contiguous(DType::F16, {hd, nkv, bs, n_blocks}, vc.data(), dev.id());
    kv.block_size = int(bs);
    AttentionBatch ab;
    ab.positions = Tensor::contiguous(DType::I32, {T}, bpos.data(), dev.id());
    ab.seq_slot = Tensor::contiguous(DType::I32, {T}, bseq.data(), dev.id());
    ab.block_tables = Tensor::contiguous(DType::I32, {blocks_per_seq, n_seq}, btab.data(), dev.id());
    ab.seq_lens = Tensor::contiguous(DType::I32, {n_seq}, blen.data(), dev.id());
    ab.max_seq_len = ctx;
    Tensor q = Tensor::contiguous(DType::F32, {hd, nh, T}, xb.data(), dev.id());
    Tensor o = Tensor::contiguous(DType::F32, {hd, nh, T}, yb.data(), dev.id());
    auto call = [&](int) { ops.attention(s, q, kv, ab, 0.088f, o); };
    const double sec = time_calls(dev, gpu ? 20 : 1, call);
    KernelResult r;
    r.graph_seconds = time_calls_recorded(dev, gpu ? 20 : 1, call);
    r.name = "attention " + std::to_string(n_seq) + " seq x " + std::to_string(rows_per_seq) + " rows, ctx " +
             std::to_string(ctx) + " (f16 cache)";
    r.seconds = sec;
    r.bytes = 2.0 * double(hd * nkv * 2) * double(ctx) * n_seq;
    const double pairs = rows_per_seq == 1 ? double(ctx) * n_seq : double(ctx) * (ctx + 1) / 2.0;
    r.flops = 4.0 * double(hd) * double(nh) * pairs;
    out.push_back(r);
  }
  return out;
}

}  // namespace tandem::cli::bench
