#include "core/interrupt_cleanup.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace tandem {
namespace {

constexpr int kSlots = 16;
constexpr size_t kMaxPath = 4096;

// A slot is readable by the handler once `used` is set (release after the path is written, acquire in the
// handler); the path is cleared only after `used` is reset.
struct Slot {
  std::atomic<bool> used{false};
  char path[kMaxPath] = {};
};
Slot g_slots[kSlots];
std::mutex g_register_mutex;  // registration from several threads (never taken by the handler)

extern "C" void remove_pending_and_exit(int sig) {
  for (Slot& s : g_slots)
    if (s.used.load(std::memory_order_acquire)) ::unlink(s.path);
  static const char msg[] = "\ntandem: interrupted; partial output removed\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(128 + sig);
}

}  // namespace

void install_interrupt_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = remove_pending_and_exit;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  });
}

PendingFile::PendingFile(const std::string& path) {
  check(path.size() < kMaxPath, "output path is too long (" + std::to_string(path.size()) + " bytes)");
  std::lock_guard<std::mutex> lock(g_register_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (g_slots[i].used.load(std::memory_order_relaxed)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].used.store(true, std::memory_order_release);
    slot_ = i;
    return;
  }
  throw Error("too many output files written at once (" + std::to_string(kSlots) + ")");
}

PendingFile::~PendingFile() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_register_mutex);
  g_slots[slot_].used.store(false, std::memory_order_release);
}

}  // namespace tandem
