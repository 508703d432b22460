// Programmatic dependent launch (PDL) for the kernels of a forward (router, align, the grouped
// GEMMs, the activation, the unpermute): the next kernel in the stream is launched while this one
// finishes, and waits on the device (griddepcontrol.wait) before touching global memory, so the
// launch latency between the small kernels of a decode step overlaps the previous kernel's tail.
// Works under stream capture. A kernel launched without the attribute (tests, the EP paths) runs
// its griddepcontrol instructions as no-ops.
// MOEKIT_DISABLE_PDL=1 (read once, through core/env) launches without it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "moekit/core/env.h"

namespace moekit::cuda {

// First instruction of a PDL kernel: wait for the previous grid in the stream before any global
// read or write, then let the next grid start its launch early.
__device__ __forceinline__ void pdl_wait_and_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// griddepcontrol.wait alone: the next launch is released only as this grid's blocks exit. The
// grouped GEMMs start this way: releasing at their start (so that the next GEMM's blocks take the
// SMs as this one's blocks exit, and wait there) measured slower at one token on mixtral-8x7b
// (195-197 vs 180-183 us, bench/results/2026-12-03-h200-decode-pdl) and no faster elsewhere.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

inline bool pdl_enabled() {
  static const bool enabled = !env::get_bool("MOEKIT_DISABLE_PDL", false);
  return enabled;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization when PDL
// is enabled. The kernel must start with pdl_wait_and_release() or pdl_wait(). A launch that fails
// returns its error and leaves none pending: the runtime also records it as the thread's last
// error, which the next unrelated cudaGetLastError() check would report as its own (seen on the
// GPU: a W4A8 GEMM launched without its shared-memory attribute failed the next test's check).
// cluster_x > 1: thread-block clusters of that many CTAs along x (grid.x a multiple of it).
template <typename... Params, typename... Args>
cudaError_t launch_pdl_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned count = 0;
  if (pdl_enabled()) {
    attr[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_x > 1) {
    attr[count].id = cudaLaunchAttributeClusterDimension;
    attr[count].val.clusterDim.x = cluster_x;
    attr[count].val.clusterDim.y = 1;
    attr[count].val.clusterDim.z = 1;
    ++count;
  }
  cfg.attrs = attr;
  cfg.numAttrs = count;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  return launch_pdl_clustered(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace moekit::cuda
