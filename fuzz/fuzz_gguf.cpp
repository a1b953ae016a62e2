// libFuzzer harness for the GGUF reader (target fuzz_gguf, built with clang; see fuzz/CMakeLists.txt).
// A good corpus to start from: `gguf_mutation_test --write-seeds corpus/`, then `fuzz_gguf corpus/`.
// Every input must either parse (and then be walked completely) or be rejected with tandem::Error; anything
// else (another exception, a sanitizer finding) is a bug.
#include <cstddef>
#include <cstdint>

#include "gguf/gguf.h"
#include "gguf_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tandem::gguf::GgufFile f = tandem::gguf::GgufFile::from_memory(data, size, "fuzz");
    tandem::gguf::fuzzing::walk_file(f);
  } catch (const tandem::Error&) {
    // rejected cleanly
  }
  return 0;
}
