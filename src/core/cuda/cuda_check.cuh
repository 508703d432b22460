// The one CUDA check macro. MOEKIT_CUDA_CHECK(call) serves the CUDA runtime (cudaError_t), the
// driver (CUresult) and cuBLAS(Lt) (cublasStatus_t) and names the failing call;
// MOEKIT_CUDA_TRY(call) is its form for launchers that return a cudaError_t instead of throwing.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "moekit/core/device.h"
#include "moekit/core/error.h"

namespace moekit {

inline cudaStream_t to_cuda(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

namespace detail {

inline bool cuda_ok(cudaError_t s) {
  return s == cudaSuccess;
}
inline bool cuda_ok(CUresult s) {
  return s == CUDA_SUCCESS;
}
inline bool cuda_ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}
inline std::string cuda_status_text(cudaError_t s) {
  return std::string(cudaGetErrorName(s)) + " (" + cudaGetErrorString(s) + ")";
}
inline std::string cuda_status_text(CUresult s) {
  return "CUresult " + std::to_string(static_cast<int>(s));
}
inline std::string cuda_status_text(cublasStatus_t s) {
  return "cublasStatus " + std::to_string(static_cast<int>(s));
}

}  // namespace detail
}  // namespace moekit

// Throws moekit::Error("CUDA call <call> failed: <status>") unless the call succeeded.
#define MOEKIT_CUDA_CHECK(call)                                                                    \
  do {                                                                                             \
    const auto moekit_cuda_status_ = (call);                                                       \
    MOEKIT_CHECK(::moekit::detail::cuda_ok(moekit_cuda_status_), "CUDA call {} failed: {}", #call, \
                 ::moekit::detail::cuda_status_text(moekit_cuda_status_));                         \
  } while (false)

// Returns the status from the enclosing function (a launcher returning cudaError_t) unless the
// runtime call succeeded.
#define MOEKIT_CUDA_TRY(call)                                           \
  do {                                                                  \
    const cudaError_t moekit_cuda_status_ = (call);                     \
    if (moekit_cuda_status_ != cudaSuccess) return moekit_cuda_status_; \
  } while (false)
