// An on/off switch read once from an environment variable, with an override for tests: how a kernel path or
// a recording rule that is new stays selectable (TANDEM_PDL=0 turns programmatic dependent launch off, ...)
// without a flag on every command. Unset or empty: the default; "0": off; any other value: on.
#pragma once

#include <atomic>
#include <cstdlib>
#include <optional>

namespace tandem {

class EnvSwitch {
 public:
  constexpr EnvSwitch(const char* name, bool default_on) : name_(name), default_on_(default_on) {}

  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    int e = env_.load(std::memory_order_relaxed);
    if (e < 0) {  // first use: read the environment (a race only reads it twice)
      const char* v = std::getenv(name_);
      e = v == nullptr || *v == '\0' ? int(default_on_) : int(*v != '0');
      env_.store(e, std::memory_order_relaxed);
    }
    return e == 1;
  }
  // Tests: forces the switch (nullopt: back to the environment). Takes effect at the next on().
  void set(std::optional<bool> on) { override_.store(on ? int(*on) : -1, std::memory_order_relaxed); }
  const char* name() const { return name_; }

 private:
  const char* name_;
  bool default_on_;
  mutable std::atomic<int> env_{-1};
  std::atomic<int> override_{-1};
};

}  // namespace tandem
