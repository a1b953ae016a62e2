// The one error type of tandem. Every failure a user can cause (bad file, bad flag, model too large, ...)
// is reported by throwing tandem::Error with a message that says what is wrong and, where it helps, what to do.
// The command line catches it, prints "error: <message>" on one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throw Error(message) unless cond holds. For checks of user input and file contents, not for asserts.
inline void check(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

}  // namespace tandem
