// One check macro for CUDA runtime and cuBLAS(Lt) calls: the message names the failing call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "moekit/core/device.h"
#include "moekit/core/error.h"

#define MOEKIT_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t moekit_cuda_status_ = (call);                                               \
    MOEKIT_CHECK(moekit_cuda_status_ == cudaSuccess, "CUDA call {} failed: {} ({})", #call,       \
                 cudaGetErrorName(moekit_cuda_status_), cudaGetErrorString(moekit_cuda_status_)); \
  } while (false)

#define MOEKIT_CUBLAS_CHECK(call)                                                             \
  do {                                                                                        \
    const cublasStatus_t moekit_cublas_status_ = (call);                                      \
    MOEKIT_CHECK(moekit_cublas_status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call {} failed: {}", \
                 #call, static_cast<int>(moekit_cublas_status_));                             \
  } while (false)

namespace moekit {
inline cudaStream_t to_cuda(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}
}  // namespace moekit
