// The device-independent half of the kernel profiler (kernel_profile.h): aggregation and names. The CUPTI
// half is src/backend/cuda/kernel_profile_cupti.cpp; a build without CUDA gets the start() below.
#include "backend/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

namespace tandem {

KernelProfile summarize_kernels(std::vector<KernelRecord> records) {
  KernelProfile p;
  records.erase(std::remove_if(records.begin(), records.end(),
                               [](const KernelRecord& r) { return r.end_ns < r.start_ns; }),
                records.end());
  if (records.empty()) return p;
  std::sort(records.begin(), records.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  std::map<std::string, KernelStat> by_name;
  uint64_t busy = 0, cur_begin = records.front().start_ns, cur_end = records.front().end_ns;
  uint64_t first = records.front().start_ns, last = 0;
  for (const KernelRecord& r : records) {
    const double d = double(r.end_ns - r.start_ns) * 1e-9;
    KernelStat& s = by_name[short_kernel_name(r.name)];
    ++s.calls;
    s.seconds += d;
    p.kernel_seconds += d;
    last = std::max(last, r.end_ns);
    // Union of intervals, walking them by start: a gap closes the current run of overlapping kernels.
    if (r.start_ns > cur_end) {
      busy += cur_end - cur_begin;
      cur_begin = r.start_ns;
      cur_end = r.end_ns;
    } else {
      cur_end = std::max(cur_end, r.end_ns);
    }
  }
  busy += cur_end - cur_begin;
  p.launches = int64_t(records.size());
  p.busy_seconds = double(busy) * 1e-9;
  p.span_seconds = double(last - first) * 1e-9;
  for (auto& [name, s] : by_name) {
    s.name = name;
    p.kernels.push_back(s);
  }
  std::sort(p.kernels.begin(), p.kernels.end(), [](const KernelStat& a, const KernelStat& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return p;
}

namespace {

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;
  std::string out(d);
  std::free(d);
  return out;
}

void erase_all(std::string& s, const std::string& what) {
  for (size_t at; (at = s.find(what)) != std::string::npos;) s.erase(at, what.size());
}

}  // namespace

std::string short_kernel_name(const std::string& name) {
  std::string s = demangle(name);
  // The parameter list: the last top-level "(...)" (template arguments may hold parentheses of their own).
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s.erase(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  erase_all(s, "(anonymous namespace)::");
  // Namespaces, in the name and in its template arguments: "a::b::f<(c::T)8>" -> "f<(T)8>". Whatever comes
  // before a "::" back to a separator is a qualifier.
  std::string out;
  size_t word = 0;  // where the current identifier began in out
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') {
      out.erase(word);
      ++i;
      continue;
    }
    out += s[i];
    const char c = s[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) word = out.size();
  }
  return out;
}

#if !defined(TANDEM_HAVE_CUDA)
std::unique_ptr<KernelProfiler> KernelProfiler::start(std::string* why_not) {
  if (why_not) *why_not = "this tandem was built without CUDA";
  return nullptr;
}
#endif

}  // namespace tandem
