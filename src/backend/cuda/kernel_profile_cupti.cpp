// The CUPTI half of the kernel profiler (kernel_profile.h): the activity API's concurrent-kernel records
// (start and end of every kernel on the GPU clock, graph launches included), with the library loaded at run
// time so that neither the build nor a machine without CUPTI needs it.
//
// CUPTI hands records over in buffers we give it (buffer_requested) and return to us when full or flushed
// (buffer_completed, possibly on a CUPTI thread): the records are copied out under a mutex there. A window
// is [begin_window, end_window] on CUPTI's clock (cuptiGetTimestamp, the same clock as the records).
#include "backend/kernel_profile.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace tandem {
namespace {

// The CUPTI entry points we use, resolved from the library at start().
struct Cupti {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*timestamp)(uint64_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

Cupti g_cupti;
std::mutex g_mutex;                  // guards g_records and g_window_start
std::vector<KernelRecord> g_records;  // kernels delivered so far (since the last begin_window)
uint64_t g_window_start = 0;
// A kernel's start is a GPU timestamp mapped onto CUPTI's host clock; the mapping can put a kernel launched just
// after begin_window a few microseconds before the window's host timestamp (seen on an H100: a tiny first kernel
// of a window was dropped, 6 of ~120 windows). Windows follow a synchronize and begin_window drops every record
// delivered before it, so a slack on the start admits no kernel of an earlier window.
constexpr uint64_t kClockSlackNs = 1000 * 1000;
bool g_active = false;  // one profiler at a time

constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (buffer == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* rec = nullptr;
    while (g_cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
      // The record layout of this CUPTI version (the header we build with is the library's major version).
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      if (k->start + kClockSlackNs < g_window_start) continue;
      g_records.push_back(KernelRecord{k->name ? k->name : "?", k->start, k->end});
    }
  }
  std::free(buffer);
}

template <class F>
bool resolve(void* lib, const char* name, F*& fn) {
  fn = reinterpret_cast<F*>(dlsym(lib, name));
  return fn != nullptr;
}

std::string load(Cupti& c) {
  const char* names[] = {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                         "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so"};
  for (const char* n : names)
    if ((c.lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (c.lib == nullptr) return "the CUPTI library (libcupti.so) was not found (it comes with the CUDA toolkit)";
  if (!resolve(c.lib, "cuptiActivityRegisterCallbacks", c.register_callbacks) ||
      !resolve(c.lib, "cuptiActivityEnable", c.enable) || !resolve(c.lib, "cuptiActivityDisable", c.disable) ||
      !resolve(c.lib, "cuptiActivityFlushAll", c.flush_all) ||
      !resolve(c.lib, "cuptiActivityGetNextRecord", c.next_record) ||
      !resolve(c.lib, "cuptiGetTimestamp", c.timestamp) || !resolve(c.lib, "cuptiGetResultString", c.result_string))
    return "the CUPTI library lacks an entry point this profiler uses";
  return "";
}

std::string describe(CUptiResult r) {
  const char* s = nullptr;
  if (g_cupti.result_string && g_cupti.result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI error " + std::to_string(int(r));
}

class CuptiProfiler final : public KernelProfiler {
 public:
  ~CuptiProfiler() override {
    g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_cupti.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
    g_active = false;
  }

  void begin_window() override {
    g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // what ran before is delivered now, and dropped
    uint64_t now = 0;
    g_cupti.timestamp(&now);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
    g_window_start = now;
  }

  KernelProfile end_window() override {
    uint64_t end = 0;
    g_cupti.timestamp(&end);
    g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::vector<KernelRecord> in;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      for (KernelRecord& r : g_records)
        if (r.start_ns + kClockSlackNs >= g_window_start && r.start_ns <= end) in.push_back(std::move(r));
      g_records.clear();
      g_window_start = ~uint64_t(0);  // nothing counts until the next window
    }
    return summarize_kernels(std::move(in));
  }
};

}  // namespace

std::unique_ptr<KernelProfiler> KernelProfiler::start(std::string* why_not) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<KernelProfiler> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_active) return fail("a kernel profiler is already running in this process");
  }
  if (g_cupti.lib == nullptr) {
    const std::string err = load(g_cupti);
    if (!err.empty()) {
      if (g_cupti.lib) dlclose(g_cupti.lib);
      g_cupti = Cupti{};
      return fail(err);
    }
    // Once per process: CUPTI keeps the first callbacks registered.
    if (const CUptiResult r = g_cupti.register_callbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS)
      return fail("CUPTI refused the record buffers: " + describe(r));
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
    g_window_start = ~uint64_t(0);
  }
  if (const CUptiResult r = g_cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); r != CUPTI_SUCCESS)
    return fail("CUPTI could not record kernels: " + describe(r) +
                " (another profiler attached, or no permission to profile: NVreg_RestrictProfilingToAdminUsers)");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_active = true;
  return std::make_unique<CuptiProfiler>();
}

}  // namespace tandem

#else  // a CUDA toolkit without the CUPTI headers

namespace tandem {
std::unique_ptr<KernelProfiler> KernelProfiler::start(std::string* why_not) {
  if (why_not) *why_not = "this tandem was built without the CUPTI headers (cupti_activity.h)";
  return nullptr;
}
}  // namespace tandem

#endif
