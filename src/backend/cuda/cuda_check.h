// Error checking for CUDA runtime and cuBLAS calls: a failing call throws tandem::Error naming the call, the
// source line and the CUDA error string, so that a user sees what failed instead of a crash.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace tandem::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error: ") + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ") in " +
              what + " at " + file + ":" + std::to_string(line));
}

}  // namespace tandem::cuda

// Checks a cudaError_t returned by `call`.
#define TANDEM_CUDA_CHECK(call)                                                      \
  do {                                                                               \
    const cudaError_t tandem_cuda_err_ = (call);                                     \
    if (tandem_cuda_err_ != cudaSuccess)                                             \
      ::tandem::cuda::throw_cuda_error(tandem_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Checks that the last kernel launch was accepted (bad configuration, missing kernel image, ...).
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())
