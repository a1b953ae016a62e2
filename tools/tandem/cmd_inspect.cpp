// `tandem inspect FILE.gguf [--json] [--items N]`: what a GGUF file holds — version, architecture, alignment,
// every metadata key with its type and value (arrays abbreviated), the tensor table and totals (and for
// gemma4 the per-layer plan). --json prints the same as one JSON document. A file the reader rejects gives
// its one-line error and exit code 1.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "convert/gemma4_layer_plan.h"
#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem::cli {
namespace {

using gguf::GgufFile;
using gguf::TensorInfo;
using gguf::Value;
using gguf::ValueType;

struct InspectArgs {
  std::string file;
  bool json = false;
  size_t items = 8;
};

// Keys and names from a file may hold control bytes: escape them so each entry stays on one line.
std::string one_line(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

std::string shape_string(const TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

std::string type_with_count(const Value& v) {
  if (v.type() != ValueType::ARRAY) return v.type_name();
  return v.type_name() + "[" + std::to_string(v.as_array().size()) + "]";
}

std::string human(double v, const char* const* units, int n_units, double base) {
  int u = 0;
  while (v >= base && u + 1 < n_units) {
    v /= base;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  std::string s = buf;
  if (s.back() == ' ') s.pop_back();  // no unit
  return s;
}
std::string human_bytes(uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return human(double(b), units, 5, 1024);
}
std::string human_count(uint64_t n) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  return human(double(n), units, 5, 1000);
}

struct Totals {
  struct PerType {
    uint64_t tensors = 0, parameters = 0, bytes = 0;
  };
  uint64_t tensors = 0, parameters = 0, bytes = 0;
  std::map<std::string, PerType> by_type;  // sorted by type name: stable output
};

Totals totals_of(const GgufFile& f) {
  Totals t;
  for (const TensorInfo& info : f.tensors()) {
    Totals::PerType& p = t.by_type[dtype_name(info.type)];
    ++t.tensors;
    ++p.tensors;
    t.parameters += uint64_t(info.nelements());
    p.parameters += uint64_t(info.nelements());
    t.bytes += info.nbytes;
    p.bytes += info.nbytes;
  }
  return t;
}

void print_text(const GgufFile& f, size_t items) {
  const std::string arch = f.architecture();
  std::printf("file:          %s\n", f.path().c_str());
  std::printf("gguf version:  %u\n", f.version());
  std::printf("architecture:  %s\n", arch.empty() ? "(none)" : one_line(arch).c_str());
  std::printf("alignment:     %zu\n", f.alignment());
  std::printf("data offset:   %llu\n", static_cast<unsigned long long>(f.data_offset()));
  std::printf("file size:     %llu bytes (%s)\n", static_cast<unsigned long long>(f.file_size()),
              human_bytes(f.file_size()).c_str());

  std::printf("\nmetadata: %zu keys\n", f.metadata().size());
  size_t key_w = 3, type_w = 4;
  for (const auto& [key, v] : f.metadata()) {
    key_w = std::max(key_w, std::min<size_t>(one_line(key).size(), 56));
    type_w = std::max(type_w, type_with_count(v).size());
  }
  std::printf("  %-*s  %-*s  %s\n", int(key_w), "KEY", int(type_w), "TYPE", "VALUE");
  for (const auto& [key, v] : f.metadata())
    std::printf("  %-*s  %-*s  %s\n", int(key_w), one_line(key).c_str(), int(type_w),
                type_with_count(v).c_str(), v.to_string(items).c_str());

  std::printf("\ntensors: %zu\n", f.tensors().size());
  if (!f.tensors().empty()) {
    size_t name_w = 4, shape_w = 5, bytes_w = 5;
    for (const TensorInfo& t : f.tensors()) {
      name_w = std::max(name_w, one_line(t.name).size());
      shape_w = std::max(shape_w, shape_string(t).size());
      bytes_w = std::max(bytes_w, std::to_string(t.nbytes).size());
    }
    std::printf("  %-*s  %-5s  %-*s  %*s  %s\n", int(name_w), "NAME", "TYPE", int(shape_w), "SHAPE",
                int(bytes_w), "BYTES", "OFFSET");
    for (const TensorInfo& t : f.tensors())
      std::printf("  %-*s  %-5s  %-*s  %*llu  %llu\n", int(name_w), one_line(t.name).c_str(),
                  dtype_name(t.type), int(shape_w), shape_string(t).c_str(), int(bytes_w),
                  static_cast<unsigned long long>(t.nbytes), static_cast<unsigned long long>(t.offset));
    std::printf("  (shapes in ggml order, innermost first; offsets relative to the data section)\n");
  }

  Totals tot = totals_of(f);
  if (arch == "gemma4")  // per-layer shapes differ (sliding/global, KV sharing, MoE): show the plan
    std::printf("\nlayers (gemma4):\n%s",
                convert::gemma4_layer_plan_text(convert::gemma4_layer_plan(f)).c_str());
  std::printf("\ntotals:\n");
  std::printf("  tensors:     %llu\n", static_cast<unsigned long long>(tot.tensors));
  std::printf("  parameters:  %llu (%s)\n", static_cast<unsigned long long>(tot.parameters),
              human_count(tot.parameters).c_str());
  std::printf("  bytes:       %llu (%s)\n", static_cast<unsigned long long>(tot.bytes),
              human_bytes(tot.bytes).c_str());
  for (const auto& [type, p] : tot.by_type)
    std::printf("  %-5s        %llu tensors, %llu parameters, %llu bytes (%s)\n", type.c_str(),
                static_cast<unsigned long long>(p.tensors), static_cast<unsigned long long>(p.parameters),
                static_cast<unsigned long long>(p.bytes), human_bytes(p.bytes).c_str());
}

nlohmann::json value_json(const Value& v, size_t items) {
  switch (v.type()) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return v.as_uint();
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      return v.as_int();
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return v.as_float();  // NaN and inf become null
    case ValueType::BOOL:
      return v.as_bool();
    case ValueType::STRING:
      return v.as_string();
    case ValueType::ARRAY: {
      const auto& elems = v.as_array();
      nlohmann::json shown = nlohmann::json::array();
      // Nested arrays show fewer items per level, as Value::to_string does: the output stays small.
      for (size_t i = 0; i < elems.size() && i < items; ++i)
        shown.push_back(value_json(elems[i], std::max<size_t>(1, items / 2)));
      return {{"element_type", gguf::value_type_name(v.element_type())},
              {"count", elems.size()},
              {"items", std::move(shown)},
              {"truncated", elems.size() > items}};
    }
  }
  return nullptr;
}

void print_json(const GgufFile& f, size_t items) {
  nlohmann::json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["architecture"] = f.architecture();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  j["file_size"] = f.file_size();
  j["metadata"] = nlohmann::json::array();
  for (const auto& [key, v] : f.metadata())
    j["metadata"].push_back(
        {{"key", key}, {"type", gguf::value_type_name(v.type())}, {"value", value_json(v, items)}});
  j["tensors"] = nlohmann::json::array();
  for (const TensorInfo& t : f.tensors()) {
    j["tensors"].push_back({{"name", t.name},
                            {"type", dtype_name(t.type)},
                            {"shape", std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)},
                            {"parameters", t.nelements()},
                            {"bytes", t.nbytes},
                            {"offset", t.offset},
                            {"file_offset", f.data_offset() + t.offset}});
  }
  Totals tot = totals_of(f);
  nlohmann::json by_type = nlohmann::json::object();
  for (const auto& [type, p] : tot.by_type)
    by_type[type] = {{"tensors", p.tensors}, {"parameters", p.parameters}, {"bytes", p.bytes}};
  j["totals"] = {
      {"tensors", tot.tensors}, {"parameters", tot.parameters}, {"bytes", tot.bytes}, {"by_type", by_type}};
  if (f.architecture() == "gemma4")
    j["layers"] = convert::gemma4_layer_plan_json(convert::gemma4_layer_plan(f));
  // Strings from the file need not be valid UTF-8: replace bad bytes rather than fail.
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

void run_inspect(const InspectArgs& args) {
  GgufFile f = GgufFile::open(args.file);
  if (args.json) {
    print_json(f, args.items);
  } else {
    print_text(f, args.items);
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a GGUF file's metadata, tensor table and totals");
  cmd->add_option("file", args->file, "GGUF file")->required();
  cmd->add_flag("--json", args->json, "print one JSON document instead of text");
  cmd->add_option("--items", args->items, "array elements shown before abbreviating")
      ->check(CLI::Range(0, 1000000));
  cmd->callback([args] {
    if (parse_only()) return;
    run_inspect(*args);
  });
}

}  // namespace tandem::cli
