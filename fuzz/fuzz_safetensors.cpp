// libFuzzer harness for the safetensors reader: any bytes either parse (and then every tensor's bytes lie
// inside the buffer and match its dtype and shape) or are rejected with tandem::Error. Any other exception, a
// sanitizer report or a tensor outside the buffer is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "convert/safetensors.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = tandem::convert::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    for (const auto& t : f.tensors()) {
      if (t.nbytes > 0 && (t.data < data || t.data + t.nbytes > data + size)) std::abort();
      if (t.nbytes != size_t(t.nelements()) * tandem::convert::st_dtype_size(t.dtype)) std::abort();
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < t.nbytes; i += 997) sink = sink ^ t.data[i];  // touch the bytes (ASan checks)
      (void)t.shape_string();
    }
    (void)f.metadata();
  } catch (const tandem::Error&) {
    // rejected cleanly
  }
  return 0;
}
