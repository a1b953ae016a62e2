// Parsing and checking of the mesh flags (--devices, --split-mode, --tensor-split, --main-device). Every
// message names the flag, quotes the offending value and says what is expected, because these errors are
// the first thing a user sees when a multi-device command line is wrong.
#include "parallel/mesh.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "core/error.h"

namespace tandem {

namespace {

constexpr const char* kDevicesExpected =
    "expected a comma-separated list such as cuda:0,cuda:1 or cpu:0,cpu:1";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// Splits on ',' keeping empty entries ("a,,b" -> {"a", "", "b"}), each trimmed of spaces.
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(trim(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string join_ids(const std::vector<DeviceId>& devices) {
  std::string s;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i) s += ',';  // appended separately: `"," + string` trips GCC 12's -Wrestrict false positive
    s += devices[i].to_string();
  }
  return s;
}

// "cpu", "cpu:N", "cuda", "cuda:N": one entry of the value of `flag` (all of it when list == entry).
DeviceId parse_device_entry(const std::string& entry, const std::string& list, const std::string& flag) {
  const size_t colon = entry.find(':');
  const std::string kind = entry.substr(0, colon);
  DeviceId id;
  if (kind == "cpu") {
    id.kind = DeviceKind::CPU;
  } else if (kind == "cuda") {
    id.kind = DeviceKind::CUDA;
  } else {
    const std::string where = entry == list ? "" : " in '" + list + "'";
    throw Error(flag + ": unknown device '" + entry + "'" + where + "; expected cpu, cpu:N, cuda or cuda:N");
  }
  if (colon == std::string::npos) return id;  // "cpu" / "cuda" alone: index 0
  const std::string index = entry.substr(colon + 1);
  int v = -1;
  const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), v);
  // from_chars accepts a leading '-', so a negative value is refused explicitly; it also stops at the first
  // non-digit, so the whole index must have been consumed.
  const bool ok = !index.empty() && ec == std::errc() && end == index.data() + index.size() && v >= 0 &&
                  index.find_first_not_of("0123456789") == std::string::npos;
  check(ok, flag + ": bad device index '" + index + "' in '" + entry +
                "'; expected a non-negative integer, as in " + kind + ":0");
  id.index = v;
  return id;
}

std::string format_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", r);
  return buf;
}

}  // namespace

const char* split_mode_name(SplitMode mode) {
  switch (mode) {
    case SplitMode::None:
      return "none";
    case SplitMode::Layer:
      return "layer";
    case SplitMode::Row:
      return "row";
    case SplitMode::Tensor:
      return "tensor";
  }
  return "?";
}

SplitMode parse_split_mode(const std::string& s) {
  for (SplitMode m : {SplitMode::None, SplitMode::Layer, SplitMode::Row, SplitMode::Tensor})
    if (s == split_mode_name(m)) return m;
  throw Error("--split-mode: unknown mode '" + s + "'; expected none, layer, row or tensor");
}

DeviceId parse_device_id(const std::string& s, const std::string& flag) {
  return parse_device_entry(s, s, flag);
}

std::vector<DeviceId> parse_device_list(const std::string& s) {
  check(!trim(s).empty(), std::string("--devices: empty list; ") + kDevicesExpected);
  const std::vector<std::string> entries = split_commas(s);
  std::vector<DeviceId> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    check(!entries[i].empty(),
          "--devices: entry " + std::to_string(i + 1) + " of '" + s + "' is empty; " + kDevicesExpected);
    const DeviceId id = parse_device_entry(entries[i], s, "--devices");
    // A GPU may be listed twice: two ranks then share it (each its own Device, memory and streams), which is
    // how one GPU tests a split; their collectives go through the copy comm. A CPU device has no reason to
    // repeat, since cpu:0, cpu:1, ... are already separate devices.
    if (id.kind == DeviceKind::CPU)
      for (const DeviceId& seen : out)
        check(!(seen == id),
              "--devices: " + id.to_string() + " is listed twice in '" + s +
                  "'; each CPU device may appear once (use cpu:0,cpu:1,... for several CPU devices)");
    out.push_back(id);
  }
  return out;
}

std::vector<double> parse_tensor_split(const std::string& s, size_t n_devices) {
  check(n_devices >= 1, "--tensor-split: there are no devices to split over");
  if (trim(s).empty()) return std::vector<double>(n_devices, 1.0 / double(n_devices));
  const std::vector<std::string> entries = split_commas(s);
  std::vector<double> ratios;
  for (const std::string& e : entries) {
    double v = 0;
    const auto [end, ec] = std::from_chars(e.data(), e.data() + e.size(), v);
    check(!e.empty() && ec == std::errc() && end == e.data() + e.size(),
          "--tensor-split: '" + e + "' in '" + s +
              "' is not a number; expected one non-negative ratio per device, such as 3,1");
    check(std::isfinite(v), "--tensor-split: '" + e + "' in '" + s +
                                "' is not a finite number; expected finite "
                                "non-negative ratios, such as 3,1");
    check(v >= 0, "--tensor-split: '" + e + "' in '" + s +
                      "' is negative; expected non-negative ratios, such as 3,1");
    ratios.push_back(v);
  }
  check(ratios.size() == n_devices, "--tensor-split: '" + s + "' has " + std::to_string(ratios.size()) +
                                        " ratio" + (ratios.size() == 1 ? "" : "s") + " for " +
                                        std::to_string(n_devices) + " device" + (n_devices == 1 ? "" : "s") +
                                        "; expected one ratio per device of --devices");
  double sum = 0;
  for (double r : ratios) sum += r;
  check(sum > 0,
        "--tensor-split: '" + s + "' gives every device a ratio of 0; expected at least one positive ratio");
  check(std::isfinite(sum), "--tensor-split: the ratios '" + s +
                                "' are too large to add up; expected small "
                                "ratios such as 3,1");
  for (double& r : ratios) r /= sum;
  return ratios;
}

void check_devices_exist(const std::vector<DeviceId>& devices) {
  for (const DeviceId& d : devices) {
    if (d.kind != DeviceKind::CUDA) continue;  // cpu:N are CPU "devices" of this process: they always exist
#if !defined(TANDEM_HAVE_CUDA)
    throw Error(
        "device " + d.to_string() +
        " does not exist: this build of tandem has no CUDA support (configure with -DTANDEM_CUDA=ON on "
        "a machine with the CUDA toolkit, or use cpu devices)");
#else
    const int n = device_count(DeviceKind::CUDA);
    if (d.index < n) continue;
    std::string have;
    if (n == 0)
      have = "this machine has no CUDA device";
    else if (n == 1)
      have = "this machine has 1 CUDA device (cuda:0)";
    else
      have = "this machine has " + std::to_string(n) +
             " CUDA devices (cuda:0 to cuda:" + std::to_string(n - 1) + ")";
    throw Error("device " + d.to_string() + " does not exist: " + have);
#endif
  }
}

std::string MeshSpec::describe() const {
  std::string s = split_mode_name(mode);
  if (mode == SplitMode::None) return s + " on " + (devices.empty() ? "?" : devices[0].to_string());
  s += " over " + join_ids(devices) + " (ratios ";
  for (size_t i = 0; i < ratios.size(); ++i) {
    if (i) s += ',';
    s += format_ratio(ratios[i]);
  }
  s += ")";
  if (main_device != 0 && size_t(main_device) < devices.size())
    s += ", main " + devices[size_t(main_device)].to_string();
  if (replicate_kv && mode == SplitMode::Tensor) s += ", replicated KV heads";
  return s;
}

MeshSpec make_mesh_spec(const std::string& devices, const std::string& mode, const std::string& tensor_split,
                        int main_device, bool replicate_kv, DeviceId default_device) {
  MeshSpec spec;
  spec.mode = trim(mode).empty() ? SplitMode::None : parse_split_mode(trim(mode));
  const bool listed = !trim(devices).empty();
  std::vector<DeviceId> list = listed ? parse_device_list(devices) : std::vector<DeviceId>{default_device};

  check(main_device >= 0 && size_t(main_device) < list.size(),
        "--main-device: " + std::to_string(main_device) + " is out of range for " +
            std::to_string(list.size()) + " device" + (list.size() == 1 ? "" : "s") + " (" + join_ids(list) +
            "); expected an index from 0 to " + std::to_string(list.size() - 1) + " into --devices");
  for (const DeviceId& d : list)
    check(d.kind == list[0].kind,
          "--devices: '" + devices +
              "' mixes CPU and CUDA devices; expected devices of one kind (all cpu:N or "
              "all cuda:N)");
  // Parsed in every mode so that malformed ratios are reported even where they would not be used.
  std::vector<double> ratios = parse_tensor_split(tensor_split, list.size());

  try {
    check_devices_exist(list);
  } catch (const Error& e) {
    throw Error(listed ? std::string("--devices: ") + e.what() : std::string(e.what()));
  }

  spec.main_device = main_device;
  spec.replicate_kv = replicate_kv;
  spec.ratios_given = !trim(tensor_split).empty();
  if (spec.mode == SplitMode::None) {
    // One device: the main one. Ratios have nothing to split.
    spec.devices = {list[size_t(main_device)]};
    spec.main_device = 0;
    spec.ratios = {1.0};
  } else {
    spec.devices = std::move(list);
    spec.ratios = std::move(ratios);
  }
  return spec;
}

}  // namespace tandem
