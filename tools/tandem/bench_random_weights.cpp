// `tandem bench --random-weights TYPE --to OUT.gguf` (bench.h) does not benchmark: it writes a copy of -m
// whose matrices are random TYPE values (TYPE as `tandem quantize` takes it, mixes such as q4_k_m included:
// each matrix gets the type quantize would give it, 3-D expert tensors too) (valid blocks with fp16 scales of
// 1e-3 .. 2e-3), for benchmark models of any type in seconds (`tandem quantize`'s scale searches take minutes
// for an 8B model; speed does not depend on the values).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/half.h"
#include "core/interrupt_cleanup.h"
#include "flag_checks.h"
#include "gguf/gguf.h"
#include "quant/quantize_model.h"

namespace tandem::cli::bench {
namespace {

// Fills n bytes of matrix data of dtype t with random values in the range of trained weights (|w| <~ 0.1):
// random quant codes with fp16 scales of 1e-3 .. 2e-3 (d and dmin of every block), or random bf16/f16/f32
// values. Matrix-vector and GEMM speed does not depend on the values, only on their being ordinary numbers.
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

}  // namespace

void write_random_weights(const std::string& in, const std::string& type_name, const std::string& out,
                          int threads) {
  quant::QuantTarget target;
  try {
    target = quant::parse_quant_target(type_name);
  } catch (const Error& e) {
    throw Error(std::string("--random-weights: ") + e.what());
  }
  check(!out.empty(), "--random-weights needs --to OUT.gguf");
  check_threads_flag(threads, "-t");  // a thread per count below: -t 100000 started 100000 threads a tensor
  check(!same_file(in, out), "--to '" + out +
                                 "' is the input model (-m); write the random-weight copy to a "
                                 "different path");
  install_interrupt_cleanup();  // Ctrl-C leaves no OUTPUT.tmp behind
  const gguf::GgufFile f = gguf::GgufFile::open(in);
  gguf::GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  w.set("general.name",
        gguf::Value::string("random " + type_name + " weights of " + f.get_string("general.name", "")));
  const int n_threads = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t seed = 1;
  // The matrices `tandem quantize` would convert get random values of the type it would give them (a matrix
  // already of that type is copied, its values serve as well).
  const std::vector<quant::TensorPlan> plan = quant::plan_quantization(f, target);
  check(plan.size() == f.tensors().size(), "internal: the quantization plan does not cover every tensor");
  w.set("general.file_type", gguf::Value::u32(target.file_type));
  for (size_t ti = 0; ti < plan.size(); ++ti) {
    const gguf::TensorInfo& t = f.tensors()[ti];
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max<uint32_t>(t.n_dims, 1));
    if (!plan[ti].convert) {
      w.add_tensor(t.name, t.type, ne, f.tensor_data(t), t.nbytes);
      continue;
    }
    const DType dt = plan[ti].to;
    const size_t n_rows = size_t(t.nelements() / t.ne[0]);
    const size_t row = dtype_row_bytes(dt, t.ne[0]), nbytes = row * n_rows;
    const uint64_t s0 = seed++;
    w.add_tensor(t.name, dt, ne, nbytes, [dt, row, rows = n_rows, n_threads, s0](uint8_t* dst) {
      std::vector<std::thread> pool;
      const size_t per = (rows + size_t(n_threads) - 1) / size_t(n_threads);
      for (int k = 0; k < n_threads; ++k) {
        const size_t r0 = std::min(rows, per * size_t(k)), r1 = std::min(rows, r0 + per);
        if (r0 < r1)
          pool.emplace_back(
              [=] { fill_random_matrix(dt, dst + r0 * row, (r1 - r0) * row, s0 * 1000003 + uint64_t(k)); });
      }
      for (auto& th : pool) th.join();
    });
  }
  w.write(out);
  std::printf("wrote %s (%s matrices with random values, other tensors and all metadata from %s)\n",
              out.c_str(), type_name.c_str(), in.c_str());
}

}  // namespace tandem::cli::bench
