// `tandem bench`: speed of a model in the spirit of llama-bench, with every figure set against the hardware
// limit it should approach.
//
//   tandem bench -m MODEL [-p 512] [-n 128] [-b 1,8,32] [-r 5] [-o md|json] [--bw GB/s] [--tflops T]
//                [--device cuda:0|cpu | --devices LIST --split-mode MODE [--tensor-split R,..] [--main-device N]]
//                [--kernels]
//
// pp: one sequence of p prompt tokens per forward pass (logits of the last row only); tokens/s = p / time.
// tg: b sequences decoded together, n steps of one token each from an empty cache; tokens/s = b n / time.
// Each test runs once to warm up (CUDA graphs, plans, caches), then r times; mean and sample standard deviation.
//
// Limits: the device's copy bandwidth is measured at start (a device-to-device copy of >= 1 GiB on CUDA, a
// host memcpy on the CPU; bytes read + written) unless --bw gives it. tg's fraction of the bandwidth limit =
// (bytes of the weights read per step + bytes of K/V read per step) / step time / bandwidth, where the weights
// read per step are all tensors except the token embedding (gathered, not read, unless it is also the output
// matrix) and the K/V read is the average over the run's steps. pp's fraction of the matmul rate = (2 x matrix
// parameters x p for the layers, 2 x n_vocab x n_embd for the last row's head, 4 x n_layer x n_head x head_dim x
// p(p+1)/2 for causal attention) / time / rate, the rate being --tflops, else 797 TFLOP/s on CUDA (bf16, measured
// on an H200) or a measured f32 matmul on the CPU.
//
// With --devices and a split mode (split_options.h) the model runs over the mesh; the report names the mode and
// the devices. The limits are measured on the main device; under tensor and row splits over several GPUs, whose
// ranks read their shards at the same time, they are multiplied by the number of GPUs (CPU "devices" share
// one memory, and layer splits run one device at a time, so those keep the one-device limits).
//
// --kernels times the CUDA (or CPU) kernels alone on the shapes of the model (or of Qwen3-8B without -m): the
// matrix-vector products per weight dtype, the prefill matmul, and attention, each against its limit.
//
// --random-weights TYPE --to OUT.gguf does not benchmark: it writes a copy of -m whose matrices are random
// TYPE values (valid blocks with fp16 scales of 1e-3 .. 2e-3), for benchmark models of any type in seconds
// (`tandem quantize`'s scale searches take minutes for an 8B model; speed does not depend on the values).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "commands.h"
#include "core/error.h"
#include "core/half.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "split_options.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  std::string batches = "1,8,32";
  int reps = 5;
  std::string output = "md";
  double bw_gbs = 0;       // 0 = measure
  double tflops = 0;       // 0 = default / measure
  std::string device;      // "" = cuda:0 when present, else cpu
  bool kernels = false;
  int threads = 0;
  std::string random_type;  // --random-weights: write -m's model with random TYPE matrices to --to, then exit
  std::string random_to;
  SplitOptions split;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Stats {
  double mean = 0, sd = 0;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    check(!item.empty() && end && *end == '\0' && v > 0 && v < (1 << 20),
          std::string(what) + ": expected a comma-separated list of positive integers, got '" + s + "'");
    out.push_back(int(v));
  }
  check(!out.empty(), std::string(what) + ": empty list");
  return out;
}

DeviceId parse_device(const std::string& s) {
  if (s.empty()) return device_count(DeviceKind::CUDA) > 0 ? DeviceId{DeviceKind::CUDA, 0} : DeviceId{};
  return parse_device_id(s, "--device");
}

// ---- hardware limits ------------------------------------------------------------------------------------------

// Copy bandwidth in bytes/s (read + write), best of several copies of `bytes`.
double measure_copy_bandwidth(Device& dev, size_t bytes) {
  Buffer a = dev.allocate(bytes), b = dev.allocate(bytes);
  Stream& s = dev.default_stream();
  if (dev.id().kind == DeviceKind::CPU) {
    std::memset(a.data(), 1, bytes);
    std::memset(b.data(), 2, bytes);
  }
  dev.copy_device_to_device(s, b.data(), a.data(), bytes);  // warm up (first touch, clocks)
  dev.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    const int n = dev.id().kind == DeviceKind::CPU ? 1 : 10;
    for (int k = 0; k < n; ++k) dev.copy_device_to_device(s, (k & 1) ? a.data() : b.data(), (k & 1) ? b.data() : a.data(), bytes);
    dev.synchronize();
    best = std::max(best, 2.0 * double(bytes) * n / seconds_since(t0));
  }
  return best;
}

// F32-weight matmul rate on the CPU, in FLOP/s (the CPU has no bf16 matrix unit to compare against).
double measure_cpu_matmul_rate(Device& dev) {
  const int64_t K = 1024, N = 1024, T = 64;
  std::vector<float> w(static_cast<size_t>(K * N)), x(size_t(K * T)), y(static_cast<size_t>(N * T));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : w) v = d(rng);
  for (auto& v : x) v = d(rng);
  Tensor W = Tensor::contiguous(DType::F32, {K, N}, w.data(), dev.id());
  Tensor X = Tensor::contiguous(DType::F32, {K, T}, x.data(), dev.id());
  Tensor Y = Tensor::contiguous(DType::F32, {N, T}, y.data(), dev.id());
  WorkspacePlan plan;
  plan.max_rows = T;
  plan.max_matmul_in = K;
  dev.ops().reserve(plan);
  dev.ops().matmul(dev.default_stream(), W, X, Y);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    dev.ops().matmul(dev.default_stream(), W, X, Y);
    best = std::max(best, 2.0 * double(K * N * T) / seconds_since(t0));
  }
  return best;
}

// ---- model shape, from the GGUF ------------------------------------------------------------------------------

struct ModelShape {
  std::string arch, name, file_type;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  uint64_t n_params = 0, weight_bytes = 0;
  uint64_t bytes_per_step = 0;  // weights a decode step reads
  uint64_t layer_matrix_params = 0;
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: %lld layers, n_embd %lld, heads %lld/%lld x %lld, n_ff %lld, vocab %lld",
                  arch.c_str(), (long long)n_layer, (long long)n_embd, (long long)n_head, (long long)n_head_kv,
                  (long long)head_dim, (long long)n_ff, (long long)n_vocab);
    return buf;
  }
};

ModelShape read_shape(const std::string& path, const ModelInfo& info) {
  ModelShape s;
  s.arch = info.arch;
  s.name = info.name;
  s.n_layer = info.n_layer;
  s.n_embd = info.n_embd;
  s.n_head = info.n_head;
  s.n_head_kv = info.n_head_kv;
  s.head_dim = info.head_dim;
  s.n_ff = info.n_ff;
  s.n_vocab = info.n_vocab;
  s.n_params = info.n_params;
  s.weight_bytes = info.weight_bytes;
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  const bool tied = f.find_tensor("output.weight") == nullptr;
  std::string types;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool embd = t.name == "token_embd.weight";
    if (!embd || tied) s.bytes_per_step += t.nbytes;
    if (t.name.rfind("blk.", 0) == 0 && t.n_dims >= 2) {
      s.layer_matrix_params += uint64_t(t.nelements());
      if (types.find(dtype_name(t.type)) == std::string::npos) types += std::string(types.empty() ? "" : "+") + dtype_name(t.type);
    }
  }
  s.file_type = types;
  return s;
}

// ---- the model benchmark ----------------------------------------------------------------------------------

struct Result {
  std::string test;
  int batch = 1;
  std::vector<double> tps;     // tokens/s of each repetition
  double fraction = NAN;       // of the relevant limit, for the mean
  std::string limit;           // "bw" or "matmul"
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n_vocab, size_t n) {
  std::vector<int32_t> t(n);
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab - 1));
  for (auto& v : t) v = d(rng);
  return t;
}

double run_pp(Session& session, int p, std::mt19937& rng, int64_t n_vocab) {
  session.clear();
  Batch b;
  const auto toks = random_tokens(rng, n_vocab, size_t(p));
  b.add_sequence(toks, 0, 0, true);
  const auto t0 = Clock::now();
  session.decode(b);  // returns once the logits are on the host
  return seconds_since(t0);
}

double run_tg(Session& session, int n, int n_seq, std::mt19937& rng, int64_t n_vocab) {
  session.clear();
  Batch b;
  const auto t0 = Clock::now();
  for (int step = 0; step < n; ++step) {
    b.clear();
    const auto toks = random_tokens(rng, n_vocab, size_t(n_seq));
    for (int s = 0; s < n_seq; ++s) b.add(toks[size_t(s)], step, s, true);
    session.decode(b);
  }
  return seconds_since(t0);
}

// ---- kernel benchmark ---------------------------------------------------------------------------------------

struct KernelResult {
  std::string name;
  double seconds = 0;     // per call (median)
  double bytes = 0;       // bytes a call must move at least
  double flops = 0;
  std::string note;
};

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

// A device matrix {K, N} of dtype t from random values, replicated `copies` times so that rotating through
// the copies keeps the working set far larger than the L2 cache.
struct DeviceMatrix {
  Buffer buf;
  std::vector<Tensor> copies;
};
DeviceMatrix make_matrix(Device& dev, DType t, int64_t K, int64_t N, int copies, const std::vector<float>& src) {
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

std::vector<KernelResult> bench_kernels(Device& dev, const ModelShape& shape) {
  std::vector<KernelResult> out;
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
  const DType types[] = {DType::BF16, DType::F16, DType::Q8_0, DType::Q6_K, DType::Q5_K, DType::Q4_K, DType::Q4_0};
  std::vector<float> src(static_cast<size_t>(E * F));
  {
    std::uniform_real_distribution<float> d(-0.05f, 0.05f);
    for (auto& v : src) v = d(rng);
  }
  for (DType t : types) {
    for (auto [K, N] : {std::pair<int64_t, int64_t>{E, F}, {F, E}}) {
      if (K % dtype_block_size(t) != 0) continue;
      DeviceMatrix m = make_matrix(dev, t, K, N, copies, src);
      // One product of T activation rows, timed over n_calls calls that rotate through the weight copies.
      auto time_matmul = [&](int64_t T, int n_calls) {
        Tensor x = Tensor::contiguous(DType::F32, {K, T}, xb.data(), dev.id());
        Tensor y = Tensor::contiguous(DType::F32, {N, T}, yb.data(), dev.id());
        KernelResult r;
        r.seconds = time_calls(dev, n_calls, [&](int i) { ops.matmul(s, m.copies[size_t(i % copies)], x, y); });
        r.name = std::string("matmul ") + dtype_name(t) + " {" + std::to_string(K) + ", " + std::to_string(N) +
                 "} T=" + std::to_string(T);
        r.bytes = double(m.copies[0].nbytes()) + double(K * T * 4 + N * T * 4);
        r.flops = 2.0 * double(K) * double(N) * double(T);
        out.push_back(r);
      };
      for (int64_t T : {int64_t(1), int64_t(8), int64_t(32)}) time_matmul(T, gpu ? 40 : 2);
      if (t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_K) time_matmul(P, gpu ? 10 : 1);  // prefill
    }
  }

  // Attention: decode over a 4096-position cache (1 and 32 sequences), and a 512-row causal prefill.
  const int64_t hd = shape.head_dim, nh = shape.n_head, nkv = shape.n_head_kv, bs = 16;
  for (auto [n_seq, ctx, rows_per_seq] : {std::tuple<int, int, int>{1, 4096, 1}, {32, 1024, 1}, {1, 512, 512}}) {
    const int64_t blocks_per_seq = (ctx + bs - 1) / bs, n_blocks = blocks_per_seq * n_seq;
    const int64_t T = int64_t(n_seq) * rows_per_seq;
    Buffer kc = dev.allocate(size_t(hd * nkv * bs * n_blocks) * 2), vc = dev.allocate(size_t(hd * nkv * bs * n_blocks) * 2);
    {
      std::vector<uint16_t> h(static_cast<size_t>(hd * nkv * bs * n_blocks));
      std::uniform_real_distribution<float> d(-1, 1);
      for (auto& v : h) v = fp32_to_fp16(d(rng));
      dev.copy_from_host(s, kc.data(), h.data(), h.size() * 2);
      dev.copy_from_host(s, vc.data(), h.data(), h.size() * 2);
      dev.synchronize();
    }
    std::vector<int32_t> pos(static_cast<size_t>(T)), seq(static_cast<size_t>(T));
    std::vector<int32_t> tables(static_cast<size_t>(blocks_per_seq * n_seq)), lens(static_cast<size_t>(n_seq), ctx);
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
    const double sec = time_calls(dev, gpu ? 20 : 1, [&](int) { ops.attention(s, q, kv, ab, 0.088f, o); });
    KernelResult r;
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

// ---- output ---------------------------------------------------------------------------------------------------

// ---- random-weight copies of a model, for benchmarks -----------------------------------------------------------

// Fills n bytes of matrix data of dtype t with random values in the range of trained weights (|w| <~ 0.1):
// random quant codes with fp16 scales of 1e-3 .. 2e-3 (d and dmin of every block), or random bf16/f16/f32 values.
// Matrix-vector and GEMM speed does not depend on the values, only on their being ordinary finite numbers.
void fill_random_matrix(DType t, uint8_t* dst, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  auto small = [&](uint64_t r) { return fp32_to_fp16(1e-3f + float(r & 0xffff) * (1e-3f / 65536.0f)); };
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
    const size_t elem = t == DType::F32 ? 4 : 2;
    for (size_t i = 0; i + elem <= n; i += elem) {
      const float v = (float(next() & 0xffffff) / float(0x1000000) - 0.5f) * 0.1f;
      if (t == DType::F32) {
        std::memcpy(dst + i, &v, 4);
      } else {
        const uint16_t h = t == DType::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
        std::memcpy(dst + i, &h, 2);
      }
    }
    return;
  }
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = next();
    std::memcpy(dst + i, &r, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) dst[i] = uint8_t(next());
  const size_t bb = dtype_block_bytes(t);
  for (size_t b = 0; b + bb <= n; b += bb) {
    const uint64_t r = next();
    const uint16_t d = small(r), dmin = small(r >> 16);
    switch (t) {
      case DType::Q6_K:
        std::memcpy(dst + b + 208, &d, 2);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        std::memcpy(dst + b, &d, 2);
        std::memcpy(dst + b + 2, &dmin, 2);
        break;
      default:  // Q8_0, Q4_0: d first
        std::memcpy(dst + b, &d, 2);
        break;
    }
  }
}

void write_random_weights(const std::string& in, const std::string& type_name, const std::string& out,
                          int threads) {
  const auto type = dtype_from_name(type_name);
  check(type.has_value() &&
            (*type == DType::F32 || *type == DType::F16 || *type == DType::BF16 || dtype_traits(*type).quantized),
        "--random-weights: unknown weight type '" + type_name + "' (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)");
  check(!out.empty(), "--random-weights needs --to OUT.gguf");
  const gguf::GgufFile f = gguf::GgufFile::open(in);
  gguf::GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  w.set("general.name", gguf::Value::string("random " + type_name + " weights of " + f.get_string("general.name", "")));
  const int n_threads = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t seed = 1;
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max<uint32_t>(t.n_dims, 1));
    const bool matrix = t.n_dims == 2 && t.ne[0] % dtype_block_size(*type) == 0;
    if (!matrix) {
      w.add_tensor(t.name, t.type, ne, f.tensor_data(t), t.nbytes);
      continue;
    }
    const size_t row = dtype_row_bytes(*type, t.ne[0]), nbytes = row * size_t(t.ne[1]);
    const DType dt = *type;
    const uint64_t s0 = seed++;
    w.add_tensor(t.name, dt, ne, nbytes, [dt, row, rows = size_t(t.ne[1]), n_threads, s0](uint8_t* dst) {
      std::vector<std::thread> pool;
      const size_t per = (rows + size_t(n_threads) - 1) / size_t(n_threads);
      for (int k = 0; k < n_threads; ++k) {
        const size_t r0 = std::min(rows, per * size_t(k)), r1 = std::min(rows, r0 + per);
        if (r0 < r1)
          pool.emplace_back([=] { fill_random_matrix(dt, dst + r0 * row, (r1 - r0) * row, s0 * 1000003 + uint64_t(k)); });
      }
      for (auto& th : pool) th.join();
    });
  }
  w.write(out);
  std::printf("wrote %s (%s matrices with random values, other tensors and all metadata from %s)\n", out.c_str(),
              type_name.c_str(), in.c_str());
}

void run_bench(const BenchArgs& a) {
  if (!a.random_type.empty()) {
    check(!a.model.empty(), "--random-weights needs the model to copy with -m");
    return write_random_weights(a.model, a.random_type, a.random_to, a.threads);
  }
  check(a.output == "md" || a.output == "json", "-o: expected md or json, got '" + a.output + "'");
  check(a.reps >= 1, "-r: at least one repetition");
  check(a.n_prompt >= 0 && a.n_gen >= 0, "-p and -n must be >= 0");
  check(a.bw_gbs >= 0 && a.tflops >= 0, "--bw and --tflops must be >= 0");
  const std::vector<int> batches = parse_int_list(a.batches, "-b");
  check(a.device.empty() || a.split.devices.empty(),
        "--device and --devices: give one of them (--devices lists every device of the mesh, --main-device picks "
        "the main one)");
  ModelParams mp;
  mp.n_threads = a.threads;
  mp.device = parse_device(a.device).to_string();
  const MeshSpec mesh = apply(a.split, mp);
  // The limits are measured on the main device, where the mode none runs and the logits land.
  const DeviceId dev_id = mesh.devices[size_t(mesh.main_device)];
  mp.device = dev_id.to_string();  // the same device for a loader that looks at `device` alone
  check(a.kernels || !a.model.empty(), "tandem bench: give a model with -m (or --kernels to time kernels alone)");

  DeviceOptions dopt;
  dopt.n_threads = a.threads;
  std::unique_ptr<Device> dev = create_device(dev_id, dopt);
  const bool gpu = dev_id.kind == DeviceKind::CUDA;
  const double bw_one = a.bw_gbs > 0 ? a.bw_gbs * 1e9 : measure_copy_bandwidth(*dev, gpu ? (size_t(1) << 30) : (size_t(64) << 20));
  const double rate_one = a.tflops > 0 ? a.tflops * 1e12 : gpu ? 797e12 : measure_cpu_matmul_rate(*dev);
  // GPUs of a tensor or row split work at the same time (see the top of this file).
  const bool concurrent = gpu && (mesh.mode == SplitMode::Tensor || mesh.mode == SplitMode::Row);
  // Distinct GPUs only: ranks that share one GPU (cuda:0,cuda:0) share its bandwidth and its matmul rate.
  std::set<int> gpus;
  for (const DeviceId& d : mesh.devices) gpus.insert(d.index);
  const int limit_devices = concurrent ? int(gpus.size()) : 1;
  const double bw = bw_one * limit_devices, rate = rate_one * limit_devices;
  const std::string rate_src = a.tflops > 0 ? "given" : gpu ? "H200 bf16, issue 5" : "measured f32 matmul";

  nlohmann::json j;
  j["device"] = dev->name();
  j["commit"] = TANDEM_GIT_COMMIT;
  j["bandwidth_gbs"] = bw / 1e9;
  j["limit_devices"] = limit_devices;
  j["bandwidth_source"] = a.bw_gbs > 0 ? "given" : "measured copy";
  j["matmul_tflops"] = rate / 1e12;
  j["matmul_source"] = rate_src;

  ModelShape shape;
  std::vector<Result> results;
  std::shared_ptr<Model> model;
  if (!a.model.empty()) {
    model = Model::load(a.model, mp);
    shape = read_shape(a.model, model->info());
  } else {  // --kernels without a model: the Qwen3-8B shape
    shape.arch = "qwen3 (8B shape)";
    shape.n_layer = 36;
    shape.n_embd = 4096;
    shape.n_head = 32;
    shape.n_head_kv = 8;
    shape.head_dim = 128;
    shape.n_ff = 12288;
    shape.n_vocab = 151936;
  }
  // What the model reports it runs on (the mesh as parsed when there is no model or the loader leaves it out).
  std::string split_mode = split_mode_name(mesh.mode);
  std::vector<std::string> devices;
  for (const DeviceId& d : mesh.devices) devices.push_back(d.to_string());
  if (model && !model->info().split_mode.empty()) split_mode = model->info().split_mode;
  if (model && !model->info().devices.empty()) devices = model->info().devices;
  j["split_mode"] = split_mode;
  j["devices"] = devices;
  j["split"] = mesh.describe();
  j["model"] = {{"path", a.model},
                {"arch", shape.arch},
                {"types", shape.file_type},
                {"shape", shape.describe()},
                {"n_params", shape.n_params},
                {"weight_bytes", shape.weight_bytes}};

  if (model) {
    const int max_b = *std::max_element(batches.begin(), batches.end());
    SessionParams sp;
    sp.n_seq_max = std::max(1, max_b);
    sp.n_batch = std::max({a.n_prompt, max_b, 1});
    sp.n_ctx = std::max(a.n_prompt + 16, (a.n_gen + 16) * max_b) + 64;
    sp.n_logits_max = std::max(1, max_b);
    Session session(model, sp);
    std::mt19937 rng(1234);
    const double kv_elem = sp.kv_type == KvType::F32 ? 4 : 2;
    if (a.n_prompt > 0) {
      Result r;
      r.test = "pp" + std::to_string(a.n_prompt);
      r.limit = "matmul";
      run_pp(session, a.n_prompt, rng, shape.n_vocab);  // warm-up
      for (int i = 0; i < a.reps; ++i) r.tps.push_back(a.n_prompt / run_pp(session, a.n_prompt, rng, shape.n_vocab));
      const double p = a.n_prompt;
      const double flops = 2.0 * double(shape.layer_matrix_params) * p + 2.0 * double(shape.n_vocab * shape.n_embd) +
                           4.0 * double(shape.n_layer * shape.n_head * shape.head_dim) * p * (p + 1) / 2;
      r.fraction = flops / (p / stats(r.tps).mean) / rate;
      results.push_back(r);
    }
    if (a.n_gen > 0) {
      for (int b : batches) {
        Result r;
        r.test = "tg" + std::to_string(a.n_gen);
        r.batch = b;
        r.limit = "bw";
        run_tg(session, std::min(a.n_gen, 8), b, rng, shape.n_vocab);  // warm-up
        for (int i = 0; i < a.reps; ++i) r.tps.push_back(double(b) * a.n_gen / run_tg(session, a.n_gen, b, rng, shape.n_vocab));
        const double step_time = double(b) / stats(r.tps).mean;
        const double avg_ctx = (a.n_gen + 1) / 2.0;
        const double kv_bytes = double(b) * double(shape.n_layer * shape.n_head_kv * shape.head_dim * 2) * kv_elem * avg_ctx;
        r.fraction = (double(shape.bytes_per_step) + kv_bytes) / step_time / bw;
        results.push_back(r);
      }
    }
  }
  std::vector<KernelResult> kres;
  if (a.kernels) kres = bench_kernels(*dev, shape);

  // Report.
  if (a.output == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const Result& r : results) {
      const Stats st = stats(r.tps);
      arr.push_back({{"test", r.test}, {"batch", r.batch}, {"tokens_per_s", st.mean}, {"stddev", st.sd},
                     {"samples", r.tps}, {"fraction_of_limit", r.fraction}, {"limit", r.limit}});
    }
    j["results"] = arr;
    nlohmann::json karr = nlohmann::json::array();
    for (const KernelResult& k : kres)
      karr.push_back({{"kernel", k.name}, {"us", k.seconds * 1e6}, {"gbs", k.bytes / k.seconds / 1e9},
                      {"fraction_of_bw", k.bytes / k.seconds / bw}, {"tflops", k.flops / k.seconds / 1e12},
                      {"fraction_of_matmul", k.flops / k.seconds / rate}});
    if (a.kernels) j["kernels"] = karr;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("device: %s\ncommit: %s\n", dev->name().c_str(), TANDEM_GIT_COMMIT);
  std::printf("split: %s\n", mesh.describe().c_str());
  if (devices.size() > 1) {
    std::string list;
    for (const std::string& d : devices) {
      if (!list.empty()) list += "; ";
      list += d;
    }
    std::printf("devices: %s\n", list.c_str());
  }
  std::string times;
  if (limit_devices > 1) times = ", x" + std::to_string(limit_devices) + " for the GPUs of the split";
  std::printf("limits: copy bandwidth %.1f GB/s (%s), matmul %.3g TFLOP/s (%s)%s\n", bw / 1e9,
              a.bw_gbs > 0 ? "given" : "measured", rate / 1e12, rate_src.c_str(), times.c_str());
  if (!a.model.empty())
    std::printf("model: %s (%s), %.2f GiB, %.2f B params\nshape: %s\n", a.model.c_str(), shape.file_type.c_str(),
                double(shape.weight_bytes) / double(1u << 30), double(shape.n_params) / 1e9, shape.describe().c_str());
  if (!results.empty()) {
    std::printf("\n| test | batch | t/s | ± | fraction of limit |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (const Result& r : results) {
      const Stats st = stats(r.tps);
      std::printf("| %s | %d | %.2f | %.2f | %.1f%% of %s |\n", r.test.c_str(), r.batch, st.mean, st.sd,
                  100.0 * r.fraction, r.limit == "bw" ? "bandwidth" : "matmul rate");
    }
  }
  if (!kres.empty()) {
    std::printf("\n| kernel | us | GB/s | %% of bw | TFLOP/s | %% of matmul |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const KernelResult& k : kres)
      std::printf("| %s | %.1f | %.0f | %.1f%% | %.1f | %.1f%% |\n", k.name.c_str(), k.seconds * 1e6,
                  k.bytes / k.seconds / 1e9, 100.0 * k.bytes / k.seconds / bw, k.flops / k.seconds / 1e12,
                  100.0 * k.flops / k.seconds / rate);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing and generation speed against hardware limits");
  cmd->add_option("-m,--model", args->model, "GGUF model file");
  cmd->add_option("-p,--n-prompt", args->n_prompt, "prompt tokens of the pp test (0 = skip)");
  cmd->add_option("-n,--n-gen", args->n_gen, "generated tokens per sequence of the tg tests (0 = skip)");
  cmd->add_option("-b,--batch", args->batches, "comma-separated numbers of parallel sequences for tg");
  cmd->add_option("-r,--repetitions", args->reps, "timed repetitions of each test");
  cmd->add_option("-o,--output", args->output, "output format: md or json");
  cmd->add_option("--bw", args->bw_gbs, "device copy bandwidth in GB/s (0 = measure)");
  cmd->add_option("--tflops", args->tflops, "matmul rate in TFLOP/s for pp's fraction (0 = default)");
  cmd->add_option("--device", args->device, "cuda:N or cpu (default: cuda:0 when present); see --devices to split");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0 = all)");
  cmd->add_flag("--kernels", args->kernels, "also time the kernels alone on the model's shapes (on the main device)");
  add_split_options(cmd, &args->split);
  cmd->add_option("--random-weights", args->random_type,
                  "instead of benchmarking: write a copy of -m whose matrices are random values of this type "
                  "(q8_0, q4_k, ...) to --to (benchmark models in seconds; speed does not depend on the values)");
  cmd->add_option("--to", args->random_to, "output file of --random-weights");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace tandem::cli
