// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the kernel before
// it on the stream is still finishing, so its launch, its index set-up and its first weight loads overlap the
// previous kernel's last wave instead of following a full drain. At decode, where a matrix product of a layer
// takes ~8-50 us, the drain-and-fill between two dependent kernels (~1-3 us) is a large share of each.
//
// The contract, for every kernel launched with launch_pdl:
//   - pdl_wait() before the first read of anything an earlier kernel wrote (activations, the q8 scratch) and
//     before the first write of anything an earlier kernel may still read: it waits until the previous grids
//     have completed and their writes are visible. Reads of weights (never written during a step) may come
//     before it: that is the point.
//   - pdl_trigger() early (at the start): lets the next kernel launch once every block of this one has
//     started; that kernel's own pdl_wait() still waits for this one to complete.
// In a kernel launched normally both are no-ops. On by default since the tenth session (H100: tandem_gpu_tests
// 75/75 with it; Qwen3-8B-shape tg128 q4_k 258.8 -> 272.7 t/s, bf16 155.4 -> 158.5); TANDEM_PDL=0 turns it off.
// (The first H200 run, 2026-12-04, measured no gain while whole-model GPU tests failed with it on: dense
// products read their input with __ldg, an invariant load the compiler may move above pdl_wait; they read
// activations with plain loads since.)
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/env_switch.h"

namespace tandem::cuda {

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

inline EnvSwitch g_pdl{"TANDEM_PDL", true};

inline bool pdl_enabled() {
  return g_pdl.on();
}

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace tandem::cuda
