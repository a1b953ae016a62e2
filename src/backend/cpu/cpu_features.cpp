#include "backend/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tandem::cpu {
namespace {

bool detect_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" in __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

bool detect_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return detect_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

bool env_disables(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

bool default_enabled() {
  static const bool enabled = detect_avx2() && !env_disables("TANDEM_CPU_NO_AVX2");
  return enabled;
}

bool default_vnni_enabled() {
  static const bool enabled = detect_avx512_vnni() && !env_disables("TANDEM_CPU_NO_VNNI");
  return enabled;
}

std::atomic<bool> g_forced_off{false};
std::atomic<bool> g_vnni_forced_off{false};

}  // namespace

bool cpu_has_avx2() {
  static const bool has = detect_avx2();
  return has;
}

bool simd_enabled() {
  return default_enabled() && !g_forced_off.load(std::memory_order_relaxed);
}

void set_simd_enabled(bool enabled) {
  g_forced_off.store(!enabled, std::memory_order_relaxed);
}

bool cpu_has_avx512_vnni() {
  static const bool has = detect_avx512_vnni();
  return has;
}

bool vnni_enabled() {
  return simd_enabled() && default_vnni_enabled() && !g_vnni_forced_off.load(std::memory_order_relaxed);
}

void set_vnni_enabled(bool enabled) {
  g_vnni_forced_off.store(!enabled, std::memory_order_relaxed);
}

}  // namespace tandem::cpu
