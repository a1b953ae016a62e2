// A device or host allocation that did not fit. The allocator names the bytes asked for and the bytes free;
// the caller that knows what the memory was for (the model's weights, the KV cache and --ctx, the working
// buffers of a batch and --batch) catches it and rethrows it with that added. An Error like any other for
// everyone else (the command line prints it and exits 1).
#pragma once

#include <string>

#include "core/error.h"

namespace tandem {

class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& message) : Error(message) {}
};

}  // namespace tandem
