// libFuzzer harness for the model loader on GGUF files whose container is valid but whose keys and shapes are
// not: the input drives edits of a small valid qwen3 / llama file (a key's value changed, removed or given
// another type; a tensor's dimension changed, a tensor dropped or renamed; huge counts such as n_layer), the
// edited file is written with the GGUF writer and loaded with Model::load, then one short decode runs when it
// loads. Each either works or throws tandem::Error; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../tests/test_model_fixture.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace {

struct Input {
  const uint8_t* p;
  size_t n;
  uint64_t take(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | (n ? (--n, *p++) : 0);
    return v;
  }
};

const std::filesystem::path& base_file(int which) {
  static std::filesystem::path files[2];
  if (files[which].empty()) {
    tandem::testing::TinyConfig c;
    c.arch = which == 0 ? "qwen3" : "llama";
    c.n_layer = 2;
    c.n_vocab = 64;
    c.n_embd = 32;
    c.n_head = 2;
    c.n_head_kv = 1;
    c.head_dim = 16;
    c.n_ff = 48;
    c.tied = which == 1;
    files[which] =
        std::filesystem::temp_directory_path() /
        ("tandem_fuzz_loader_base_" + std::to_string(::getpid()) + "_" + std::to_string(which) + ".gguf");
    tandem::testing::write_tiny_gguf(tandem::testing::make_tiny(c), files[which]);
  }
  return files[which];
}

const int64_t kInteresting[] = {
    0, 1, 2, 3, 7, 16, 31, 32, 33, 48, 64, 1000, 65535, 1 << 20, int64_t(1) << 31, int64_t(1) << 40, -1, -7};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  Input in{data, size};
  const gguf::GgufFile base = gguf::GgufFile::open(base_file(int(in.take(1) & 1)).string());
  gguf::GgufWriter w;
  for (const auto& [k, v] : base.metadata()) w.set(k, v);
  std::vector<std::string> keys;
  for (const auto& [k, v] : base.metadata()) keys.push_back(k);
  struct T {
    std::string name;  // as written (may be renamed)
    gguf::TensorInfo info;
    bool keep = true;
  };
  std::vector<T> tensors;
  for (const auto& t : base.tensors()) tensors.push_back({t.name, t, true});

  const int edits = int(in.take(1) % 6) + 1;
  for (int e = 0; e < edits && in.n > 0; ++e) {
    const uint64_t op = in.take(1) % 7;
    const int64_t val = kInteresting[in.take(1) % (sizeof kInteresting / sizeof kInteresting[0])];
    if (op <= 2 && !keys.empty()) {
      const std::string& k = keys[in.take(1) % keys.size()];
      if (op == 0) w.set(k, gguf::Value::u32(uint32_t(val)));
      if (op == 1) w.set(k, gguf::Value::f32(float(val) * 0.5f));
      if (op == 2) w.remove(k);
    } else if (!tensors.empty()) {
      T& t = tensors[in.take(1) % tensors.size()];
      if (op == 3) t.keep = false;
      if (op == 4 && t.info.n_dims > 0) t.info.ne[in.take(1) % t.info.n_dims] = val > 0 ? val : 1;
      if (op == 5) t.name += "x";
      if (op == 6) w.set(keys.empty() ? "general.architecture" : keys[0], gguf::Value::string("llama"));
    }
  }
  // Tensors: the base's bytes where the shape still fits them, else zeros of the new size (capped). The
  // writer itself refuses some edits (a row that is not a whole number of quant blocks): those inputs end
  // here.
  try {
    for (const T& t : tensors) {
      if (!t.keep) continue;
      int64_t rows = 1;
      for (uint32_t d = 1; d < t.info.n_dims; ++d) rows *= t.info.ne[d];
      const size_t bytes = tandem::dtype_row_bytes(t.info.type, t.info.ne[0]) * size_t(rows);
      if (bytes > (size_t(64) << 20)) return 0;  // a huge tensor would only test the machine's memory
      std::vector<uint8_t> buf(bytes, 0);
      const uint8_t* src = base.tensor_data(t.info);  // t.info still names the base's tensor and offset
      std::copy_n(src, std::min(bytes, t.info.nbytes), buf.begin());
      std::vector<int64_t> ne(t.info.ne.begin(), t.info.ne.begin() + t.info.n_dims);
      w.add_tensor(t.name, t.info.type, ne, std::move(buf));
    }
  } catch (const Error&) {
    return 0;
  }
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("tandem_fuzz_loader_" + std::to_string(::getpid()) + ".gguf");
  try {
    w.write(out.string());
    ModelParams mp;
    mp.n_threads = 1;
    auto model = Model::load(out.string(), mp);
    SessionParams sp;
    sp.n_ctx = 8;
    sp.n_batch = 4;
    Session s(model, sp);
    Batch b;
    b.add(1, 0, 0, false);
    b.add(2, 1, 0, true);
    s.decode(b);
    (void)s.logits(1);
  } catch (const Error&) {
  }
  return 0;
}
