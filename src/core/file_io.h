// Reading a whole input file named by the user, with a clear error for what is not a readable regular file
// (a directory, a FIFO, a device, a missing or unreadable path) instead of an empty text or a blocked read.
#pragma once

#include <string>

namespace tandem {

// The bytes of the regular file at `path`. `what` names the input in messages ("text file", "prompt file").
std::string read_regular_file(const std::string& path, const std::string& what);

// Whether two paths name the same file (the same path after resolving links and dots, or the same inode).
bool same_file(const std::string& a, const std::string& b);

}  // namespace tandem
