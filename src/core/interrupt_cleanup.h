// Partial output files must not outlive an interrupted command: a file being written registers its path here
// (PendingFile, for the time of the write), and the SIGINT / SIGTERM handler that install_interrupt_cleanup()
// sets removes every registered path, then ends the process with exit status 128 + signal.
//
// The handler only calls async-signal-safe functions (unlink, write, _exit) on paths copied into fixed static
// slots when they were registered.
#pragma once

#include <string>

namespace tandem {

// Installs the handler (once; later calls do nothing). Commands that write files call it before writing.
void install_interrupt_cleanup();

// Registers `path` for removal on SIGINT / SIGTERM while this object lives. Throws Error when the path is too
// long for a slot or every slot is taken (a program writes few files at once).
class PendingFile {
 public:
  explicit PendingFile(const std::string& path);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

 private:
  int slot_ = -1;
};

}  // namespace tandem
