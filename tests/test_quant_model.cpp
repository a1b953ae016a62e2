// Requantizing whole GGUF files (quant/quantize_model.h) and the `tandem quantize` command, on small models
// that the tests write with the GGUF writer.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"

using namespace tandem;
using namespace tandem::quant;
namespace fs = std::filesystem;

namespace {

constexpr int kLayers = 8;
constexpr int64_t kEmbd = 256;

struct SourceTensor {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
  std::vector<float> values;  // what the stored bytes decode to
  std::vector<uint8_t> bytes;
};

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("tandem_quant_model_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// A llama-shaped model: token_embd, optional output, per layer attn_norm (1-D), attn_v, ffn_down, plus odd
// shapes (ne[0] = 96: no K-quant block fits; ne[0] = 40: no 32-block fits) and non-f32 sources.
std::vector<SourceTensor> make_tensors(bool with_output, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SourceTensor> ts;
  auto add = [&](const std::string& name, DType type, std::vector<int64_t> ne, float sigma) {
    SourceTensor t{name, type, ne, {}, {}};
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    if (name.find("norm") != std::string::npos)
      for (auto& v : x) v = 1.0f + v;  // norm weights sit around 1
    t.bytes.resize(dtype_row_bytes(type, ne[0]) * size_t(n / ne[0]));
    quantize_matrix(type, x.data(), t.bytes.data(), n / ne[0], ne[0], 1);
    t.values.resize(x.size());
    for (int64_t r = 0; r < n / ne[0]; ++r)
      dequantize_row(type, t.bytes.data() + size_t(r) * dtype_row_bytes(type, ne[0]),
                     t.values.data() + r * ne[0], ne[0]);
    ts.push_back(std::move(t));
  };
  add("token_embd.weight", DType::F32, {kEmbd, 48}, 1.0f);
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    add(p + "attn_norm.weight", DType::F32, {kEmbd}, 0.1f);
    add(p + "attn_v.weight", i == 1 ? DType::BF16 : DType::F32, {kEmbd, 32}, 0.02f);
    add(p + "ffn_down.weight", i == 2 ? DType::F16 : (i == 3 ? DType::Q8_0 : DType::F32), {2 * kEmbd, 16},
        0.02f);
  }
  add("blk.0.odd96.weight", DType::F32, {96, 8}, 1.0f);
  add("blk.0.odd40.weight", DType::F32, {40, 8}, 1.0f);
  add("output_norm.weight", DType::F32, {kEmbd}, 0.1f);
  if (with_output) add("output.weight", DType::F32, {kEmbd, 48}, 1.0f);
  return ts;
}

void write_model(const std::string& path, const std::vector<SourceTensor>& ts) {
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.set("general.name", gguf::Value::string("quant test"));
  w.set("general.file_type", gguf::Value::u32(0));
  w.set("llama.block_count", gguf::Value::u32(kLayers));
  w.set("llama.rope.freq_base", gguf::Value::f32(10000.0f));
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array({"a", "b", "<s>"}));
  w.set("test.nested", gguf::Value::array(gguf::ValueType::ARRAY,
                                          {gguf::Value::i32_array({1, 2}), gguf::Value::i32_array({3})}));
  for (const auto& t : ts) w.add_tensor(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
  w.write(path);
}

double bound_for(DType t) {
  switch (t) {
    case DType::F32:
      return 0.0;
    case DType::F16:
      return 1e-3;
    case DType::BF16:
      return 5e-3;
    case DType::Q8_0:
      return 0.006;
    case DType::Q6_K:
      return 0.02;
    case DType::Q5_K:
      return 0.04;
    case DType::Q4_K:
      return 0.08;
    case DType::Q4_0:
      return 0.09;
    default:
      return 0.0;
  }
}

std::vector<float> decode(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  std::vector<float> y(static_cast<size_t>(t.nelements()));
  const size_t rb = dtype_row_bytes(t.type, t.ne[0]);
  for (int64_t r = 0; r < t.nelements() / t.ne[0]; ++r)
    dequantize_row(t.type, f.tensor_data(t) + size_t(r) * rb, y.data() + r * t.ne[0], t.ne[0]);
  return y;
}

// Checks everything about OUT that does not depend on the recipe: metadata, 1-D tensors, values; returns
// the type of every tensor.
std::map<std::string, DType> check_output(const std::string& in_path, const std::string& out_path,
                                          const std::vector<SourceTensor>& src, const QuantTarget& target) {
  const auto in = gguf::GgufFile::open(in_path);
  const auto out = gguf::GgufFile::open(out_path);
  for (const auto& [key, value] : in.metadata()) {
    const gguf::Value* v = out.find(key);
    EXPECT_NE(v, nullptr) << key;
    if (v && key != "general.file_type") {
      EXPECT_TRUE(*v == value) << key;
    }
  }
  EXPECT_EQ(out.get_int("general.file_type"), int64_t(target.file_type));
  EXPECT_EQ(out.get("general.file_type").type(), gguf::ValueType::UINT32);
  EXPECT_EQ(out.get_int("general.quantization_version"), 2);
  EXPECT_EQ(out.metadata().size(), in.metadata().size() + 1);  // + quantization_version

  std::map<std::string, DType> types;
  EXPECT_EQ(out.tensors().size(), src.size());
  for (const auto& s : src) {
    const gguf::TensorInfo* t = out.find_tensor(s.name);
    if (!t) {
      ADD_FAILURE() << "missing " << s.name;
      continue;
    }
    types[s.name] = t->type;
    EXPECT_EQ(t->n_dims, s.ne.size()) << s.name;
    for (size_t d = 0; d < s.ne.size(); ++d) EXPECT_EQ(t->ne[d], s.ne[d]) << s.name;
    if (s.ne.size() == 1) {  // 1-D tensors are copied byte for byte
      EXPECT_EQ(t->type, s.type) << s.name;
      EXPECT_EQ(std::vector<uint8_t>(out.tensor_data(*t), out.tensor_data(*t) + t->nbytes), s.bytes)
          << s.name;
      continue;
    }
    const auto y = decode(out, *t);
    const double err = relative_rms_error(s.values.data(), y.data(), int64_t(y.size()));
    EXPECT_LE(err, bound_for(t->type)) << s.name << " as " << dtype_name(t->type);
  }
  return types;
}

}  // namespace

TEST(QuantModel, MoreBitsLayers) {
  std::vector<int> chosen;
  for (int i = 0; i < 8; ++i)
    if (more_bits_layer(i, 8)) chosen.push_back(i);
  EXPECT_EQ(chosen, (std::vector<int>{0, 3, 6, 7}));
  chosen.clear();
  for (int i = 0; i < 32; ++i)
    if (more_bits_layer(i, 32)) chosen.push_back(i);
  // first 4, last 4, and 4 + 2, 4 + 5, ... in between
  EXPECT_EQ(chosen, (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

TEST(QuantModel, ParseTarget) {
  EXPECT_EQ(parse_quant_target("Q4_K_M").base, DType::Q4_K);
  EXPECT_TRUE(parse_quant_target("q4_k_m").mixed);
  EXPECT_EQ(parse_quant_target("q4_k_m").file_type, 15u);
  EXPECT_EQ(parse_quant_target("q4_k").file_type, 14u);
  EXPECT_EQ(parse_quant_target("q5_k").file_type, 16u);
  EXPECT_EQ(parse_quant_target("q5_k_m").file_type, 17u);
  EXPECT_EQ(parse_quant_target("q6_k").file_type, 18u);
  EXPECT_EQ(parse_quant_target("q8_0").file_type, 7u);
  EXPECT_EQ(parse_quant_target("q4_0").file_type, 2u);
  EXPECT_EQ(parse_quant_target("bf16").file_type, 32u);
  EXPECT_EQ(parse_quant_target("f16").file_type, 1u);
  EXPECT_EQ(parse_quant_target("f32").file_type, 0u);
  try {
    parse_quant_target("q3_k");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k_m"), std::string::npos) << e.what();  // lists the valid types
  }
}

TEST(QuantModel, EveryPlainTypeQuantizesEveryMatrix) {
  TempDir dir;
  const auto src = make_tensors(true, 1);
  const std::string in = dir.file("in.gguf");
  write_model(in, src);
  for (const char* name : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}) {
    SCOPED_TRACE(name);
    const QuantTarget target = parse_quant_target(name);
    const std::string out = dir.file(std::string("out_") + name + ".gguf");
    QuantizeOptions o;
    o.n_threads = 2;
    size_t calls = 0;
    double last_fraction = -1;
    o.progress = [&](size_t, size_t count, const TensorPlan&, double f) {
      ++calls;
      EXPECT_EQ(count, src.size());
      EXPECT_GE(f, last_fraction);
      last_fraction = f;
    };
    const QuantizeResult r = quantize_model(in, out, target, o);
    EXPECT_GE(calls, src.size());
    EXPECT_EQ(r.output_bytes, fs::file_size(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    const auto types = check_output(in, out, src, target);
    const int64_t block = dtype_block_size(target.base);
    for (const auto& s : src) {
      if (s.ne.size() == 1) continue;
      DType want = target.base;
      if (s.ne[0] % block != 0) want = (s.ne[0] % 32 == 0 && block > 32) ? DType::Q8_0 : DType::F16;
      EXPECT_EQ(types.at(s.name), want) << s.name;
    }
  }
}

TEST(QuantModel, Q4_K_MRecipe) {
  TempDir dir;
  for (bool with_output : {true, false}) {
    SCOPED_TRACE(with_output ? "separate output.weight" : "tied output (token_embd is the head)");
    const auto src = make_tensors(with_output, 2);
    const std::string in = dir.file("in.gguf"), out = dir.file("out.gguf");
    write_model(in, src);
    const QuantTarget target = parse_quant_target("q4_k_m");
    quantize_model(in, out, target);
    const auto types = check_output(in, out, src, target);
    const std::set<int> more_bits = {0, 3, 6, 7};  // more_bits_layer(i, 8)
    for (int i = 0; i < kLayers; ++i) {
      const DType want = more_bits.count(i) ? DType::Q6_K : DType::Q4_K;
      EXPECT_EQ(types.at("blk." + std::to_string(i) + ".attn_v.weight"), want) << i;
      EXPECT_EQ(types.at("blk." + std::to_string(i) + ".ffn_down.weight"), want) << i;
    }
    if (with_output) {
      EXPECT_EQ(types.at("output.weight"), DType::Q6_K);
      EXPECT_EQ(types.at("token_embd.weight"), DType::Q4_K);
    } else {
      EXPECT_EQ(types.at("token_embd.weight"), DType::Q6_K);
    }
    EXPECT_EQ(types.at("blk.0.odd96.weight"), DType::Q8_0);
    EXPECT_EQ(types.at("blk.0.odd40.weight"), DType::F16);
  }
}

TEST(QuantModel, PlanExplainsFallbacksAndCopiesSameType) {
  TempDir dir;
  auto src = make_tensors(true, 3);
  const std::string in = dir.file("in.gguf");
  write_model(in, src);
  const auto f = gguf::GgufFile::open(in);
  const auto plan = plan_quantization(f, parse_quant_target("q8_0"));
  for (const auto& p : plan) {
    if (p.name == "blk.3.ffn_down.weight") {  // already q8_0: copied, not requantized
      EXPECT_EQ(p.to, DType::Q8_0);
      EXPECT_FALSE(p.convert);
    }
    if (p.name == "blk.0.odd40.weight") {
      EXPECT_EQ(p.to, DType::F16);
      EXPECT_NE(p.note.find("block size 32"), std::string::npos) << p.note;
    }
    if (p.name == "output_norm.weight") {
      EXPECT_FALSE(p.convert);
    }
  }
  // The copied q8_0 tensor is bit-identical.
  const std::string out = dir.file("out.gguf");
  quantize_model(in, out, parse_quant_target("q8_0"));
  const auto g = gguf::GgufFile::open(out);
  const auto* t = g.find_tensor("blk.3.ffn_down.weight");
  ASSERT_NE(t, nullptr);
  const auto* s = f.find_tensor("blk.3.ffn_down.weight");
  EXPECT_EQ(std::vector<uint8_t>(g.tensor_data(*t), g.tensor_data(*t) + t->nbytes),
            std::vector<uint8_t>(f.tensor_data(*s), f.tensor_data(*s) + s->nbytes));
}

TEST(QuantModel, RequantizingAQuantizedModel) {
  // q8_0 -> q4_k: the source is dequantized first; the result is close to the original f32 values.
  TempDir dir;
  const auto src = make_tensors(true, 4);
  const std::string in = dir.file("in.gguf"), mid = dir.file("mid.gguf"), out = dir.file("out.gguf");
  write_model(in, src);
  quantize_model(in, mid, parse_quant_target("q8_0"));
  quantize_model(mid, out, parse_quant_target("q4_k"));
  const auto f = gguf::GgufFile::open(out);
  for (const auto& s : src) {
    const auto* t = f.find_tensor(s.name);
    ASSERT_NE(t, nullptr);
    if (s.ne.size() == 1 || s.ne[0] % 256 != 0) continue;
    EXPECT_EQ(t->type, DType::Q4_K) << s.name;
    const auto y = decode(f, *t);
    EXPECT_LE(relative_rms_error(s.values.data(), y.data(), int64_t(y.size())), 0.08) << s.name;
  }
}

TEST(QuantModel, BadInputGivesClearErrorsAndNoOutput) {
  TempDir dir;
  const auto src = make_tensors(true, 5);
  const std::string in = dir.file("in.gguf");
  write_model(in, src);
  const QuantTarget q4 = parse_quant_target("q4_k");
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { quantize_model(dir.file("missing.gguf"), dir.file("o.gguf"), q4); }, "does not exist");
  expect_error([&] { quantize_model(in, in, q4); }, "is the input file");
  expect_error([&] { quantize_model(in, dir.file("sub/../in.gguf"), q4); }, "is the input file");
  EXPECT_FALSE(fs::exists(dir.file("o.gguf")));

  // A truncated input: the reader's error, and no output file (nor its .tmp) left behind.
  const std::string cut = dir.file("cut.gguf");
  fs::copy_file(in, cut);
  fs::resize_file(cut, fs::file_size(in) - 100);
  EXPECT_THROW(quantize_model(cut, dir.file("o.gguf"), q4), Error);
  EXPECT_FALSE(fs::exists(dir.file("o.gguf")));
  EXPECT_FALSE(fs::exists(dir.file("o.gguf.tmp")));
}

TEST(QuantModel, CommandLine) {
  TempDir dir;
  const auto src = make_tensors(true, 6);
  const std::string in = dir.file("in.gguf"), out = dir.file("out.gguf"), log = dir.file("log.txt");
  write_model(in, src);
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(TANDEM_BIN) + " quantize " + args + " >" + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream f(log);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, text);
  };
  auto [rc, text] = run(in + " " + out + " q4_k_m --threads 2");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("note: blk.0.odd40.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("wrote " + out), std::string::npos) << text;
  const auto f = gguf::GgufFile::open(out);
  EXPECT_EQ(f.get_int("general.file_type"), 15);
  EXPECT_EQ(f.find_tensor("output.weight")->type, DType::Q6_K);

  std::tie(rc, text) = run(in + " " + dir.file("x.gguf") + " q3_k");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("error: unknown quantization type 'q3_k'"), std::string::npos) << text;
  std::tie(rc, text) = run(dir.file("nope.gguf") + " " + dir.file("x.gguf") + " q8_0");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("does not exist"), std::string::npos) << text;
  std::tie(rc, text) = run(in + " " + in + " q8_0");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(text.find("is the input file"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}
