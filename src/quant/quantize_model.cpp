#include "quant/quantize_model.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "core/error.h"
#include "core/file_io.h"
#include "quant/quant.h"

namespace tandem::quant {
namespace {

namespace fs = std::filesystem;

struct TargetSpec {
  const char* name;
  DType base;
  bool mixed;
  uint32_t file_type;  // llama_ftype
};

constexpr TargetSpec kTargets[] = {
    {"f32", DType::F32, false, 0},      {"f16", DType::F16, false, 1},     {"bf16", DType::BF16, false, 32},
    {"q8_0", DType::Q8_0, false, 7},    {"q4_0", DType::Q4_0, false, 2},   {"q4_k", DType::Q4_K, false, 14},
    {"q4_k_s", DType::Q4_K, false, 14}, {"q5_k", DType::Q5_K, false, 16},  {"q5_k_s", DType::Q5_K, false, 16},
    {"q6_k", DType::Q6_K, false, 18},   {"q4_k_m", DType::Q4_K, true, 15}, {"q5_k_m", DType::Q5_K, true, 17},
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Layer index of "blk.N.<role>.weight", or nullopt.
std::optional<int> layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return std::nullopt;
  size_t i = 4;
  int layer = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && layer < 1000000)
    layer = layer * 10 + (name[i++] - '0');
  if (i == 4 || i >= name.size() || name[i] != '.') return std::nullopt;
  return layer;
}

// "attn_v" of "blk.3.attn_v.weight"; "output" of "output.weight".
std::string_view role_of(std::string_view name) {
  if (layer_of(name)) name = name.substr(name.find('.', 4) + 1);
  if (ends_with(name, ".weight")) name = name.substr(0, name.size() - 7);
  return name;
}

bool is_weight_matrix(const gguf::TensorInfo& t) {
  return t.n_dims >= 2 && t.ne[1] > 1 && ends_with(t.name, ".weight") &&
         t.name.find("_norm") == std::string::npos && t.name.find("ffn_gate_inp") == std::string::npos &&
         is_convertible(t.type);
}

int layer_count(const gguf::GgufFile& in) {
  const std::string arch = in.architecture();
  if (!arch.empty()) {
    const gguf::Value* v = in.find(arch + ".block_count");
    if (v && v->is_integer() && v->as_int() > 0 && v->as_int() < 1000000) return int(v->as_int());
  }
  int n = 0;
  for (const auto& t : in.tensors())
    if (auto l = layer_of(t.name)) n = std::max(n, *l + 1);
  return n;
}

// The type the recipe wants for a weight matrix, before checking that its block fits ne[0].
DType recipe_type(const gguf::TensorInfo& t, const QuantTarget& target, bool has_output, int n_layer,
                  std::string& note) {
  if (!target.mixed) return target.base;
  const std::string_view role = role_of(t.name);
  if (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight")) {
    note =
        t.name == "output.weight" ? "output head" : "token_embd is also the output head (no output.weight)";
    return DType::Q6_K;
  }
  const auto layer = layer_of(t.name);
  if (layer && (role == "attn_v" || role.substr(0, 8) == "ffn_down") && more_bits_layer(*layer, n_layer)) {
    note = std::string(role) + " of layer " + std::to_string(*layer) + " of " + std::to_string(n_layer);
    return DType::Q6_K;
  }
  if (layer && role == "attn_qkv" && target.base == DType::Q4_K) {
    note = "fused attn_qkv";
    return DType::Q5_K;
  }
  return target.base;
}

}  // namespace

QuantTarget parse_quant_target(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  for (const auto& s : kTargets)
    if (lower == s.name) return QuantTarget{lower, s.base, s.mixed, s.file_type};
  throw Error("unknown quantization type '" + std::string(name) + "'; valid types: " + quant_target_names());
}

std::string quant_target_names() {
  std::string s;
  for (const auto& t : kTargets) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

bool more_bits_layer(int i, int n) {
  if (i < n / 8 || i >= 7 * n / 8) return true;
  return (i - n / 8) % 3 == 2;
}

std::vector<TensorPlan> plan_quantization(const gguf::GgufFile& in, const QuantTarget& target) {
  const bool has_output = in.find_tensor("output.weight") != nullptr;
  const int n_layer = layer_count(in);
  std::vector<TensorPlan> plan;
  for (const auto& t : in.tensors()) {
    TensorPlan p{t.name, t.type, t.type, false, ""};
    if (is_weight_matrix(t)) {
      std::string why;
      DType want = recipe_type(t, target, has_output, n_layer, why);
      if (want != target.base) p.note = std::string(dtype_name(want)) + ": " + why;
      if (t.ne[0] % dtype_block_size(want) != 0) {
        const DType fallback = (t.ne[0] % 32 == 0 && dtype_block_size(want) > 32) ? DType::Q8_0 : DType::F16;
        p.note = "ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " + dtype_name(want) +
                 "'s block size " + std::to_string(dtype_block_size(want)) + ": " + dtype_name(fallback) +
                 " instead";
        want = fallback;
      }
      p.to = want;
      p.convert = want != t.type;
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

QuantizeResult quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantTarget& target, const QuantizeOptions& options) {
  std::error_code ec;
  check(fs::exists(in_path, ec), "input file '" + in_path + "' does not exist");
  check(!fs::is_directory(in_path, ec), "input '" + in_path + "' is a directory, not a GGUF file");
  check(!out_path.empty(), "no output path given");
  check(!same_file(in_path, out_path),
        "output '" + out_path + "' is the input file; write the quantized model to a different path");

  const gguf::GgufFile in = gguf::GgufFile::open(in_path);
  QuantizeResult result;
  result.plan = plan_quantization(in, target);
  result.input_bytes = in.file_size();

  gguf::GgufWriter writer;
  for (const auto& [key, value] : in.metadata()) writer.set(key, value);
  writer.set("general.file_type", gguf::Value::u32(target.file_type));
  writer.set("general.quantization_version", gguf::Value::u32(2));

  const auto& infos = in.tensors();
  double total_elements = 0;
  for (const auto& t : infos) total_elements += double(t.nelements());
  total_elements = std::max(total_elements, 1.0);

  // Elements of the tensors before each one, for the progress fraction.
  std::vector<double> elements_before(infos.size() + 1, 0.0);
  for (size_t i = 0; i < infos.size(); ++i)
    elements_before[i + 1] = elements_before[i] + double(infos[i].nelements());

  for (size_t i = 0; i < infos.size(); ++i) {
    const gguf::TensorInfo& t = infos[i];
    const TensorPlan& p = result.plan[i];
    const std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::min<uint32_t>(t.n_dims, 4));
    const size_t out_bytes =
        dtype_row_bytes(p.to, t.ne[0]) * size_t(t.nelements() / std::max<int64_t>(t.ne[0], 1));
    auto report = [&options, &p, &elements_before, total_elements, i,
                   n = infos.size()](double done_in_tensor) {
      if (options.progress) options.progress(i, n, p, (elements_before[i] + done_in_tensor) / total_elements);
    };
    writer.add_tensor(t.name, p.to, ne, out_bytes, [&in, &t, &p, &options, report, out_bytes](uint8_t* dst) {
      report(0);
      const uint8_t* src = in.tensor_data(t);
      if (!p.convert) {
        std::memcpy(dst, src, out_bytes);
        return;
      }
      const int64_t n_per_row = t.ne[0];
      const int64_t nrows = n_per_row > 0 ? t.nelements() / n_per_row : 0;
      const size_t in_row = dtype_row_bytes(t.type, n_per_row), out_row = dtype_row_bytes(p.to, n_per_row);
      // Rows go through an f32 buffer of at most ~4M values at a time.
      const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(n_per_row, 1));
      std::vector<float> f32(size_t(std::min(chunk, nrows) * n_per_row));
      for (int64_t r0 = 0; r0 < nrows; r0 += chunk) {
        const int64_t nr = std::min(chunk, nrows - r0);
        for (int64_t r = 0; r < nr; ++r)
          dequantize_row(t.type, src + size_t(r0 + r) * in_row, f32.data() + r * n_per_row, n_per_row);
        try {
          quantize_matrix(p.to, f32.data(), dst + size_t(r0) * out_row, nr, n_per_row, options.n_threads);
        } catch (const Error& e) {
          throw Error("tensor '" + t.name + "' (rows from " + std::to_string(r0) + "): " + e.what());
        }
        report(double((r0 + nr) * n_per_row));
      }
    });
  }
  writer.write(out_path);
  result.output_bytes = uint64_t(fs::file_size(out_path, ec));
  return result;
}

}  // namespace tandem::quant
