#include "core/elementwise.h"

#include <limits>

#include "moekit/core/checks.h"

namespace moekit {

void add_inplace(Tensor& out, const Tensor& other, Stream stream) {
  MOEKIT_CHECK(out.shape() == other.shape() && out.dtype() == other.dtype(),
               "add_inplace: {} and {} must match", out.describe(), other.describe());
  expect_contiguous(out, "add_inplace output");
  expect_contiguous(other, "add_inplace input");
  expect_device(other, "add_inplace input", out.device());
  if (out.device().is_cuda()) {
#ifdef MOEKIT_WITH_CUDA
    add_inplace_cuda(out, other, stream);
    return;
#endif
  }
  const int64_t n = out.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    store_float(
        out.data(), out.dtype(), i,
        load_float(out.data(), out.dtype(), i) + load_float(other.data(), other.dtype(), i));
  }
}

void convert_ids_to_int32(const Tensor& ids64, Tensor& ids32, Stream stream) {
  expect_dtype(ids64, "topk_ids", {DType::kInt64});
  expect_dtype(ids32, "topk_ids (int32)", {DType::kInt32});
  MOEKIT_CHECK(ids64.shape() == ids32.shape(), "convert_ids_to_int32: {} vs {}", ids64.describe(),
               ids32.describe());
  expect_contiguous(ids64, "topk_ids");
  if (ids64.device().is_cuda()) {
#ifdef MOEKIT_WITH_CUDA
    convert_ids_to_int32_cuda(ids64, ids32, stream);
    return;
#endif
  }
  const int64_t* src = ids64.data_as<int64_t>();
  int32_t* dst = ids32.data_as<int32_t>();
  for (int64_t i = 0; i < ids64.numel(); ++i) {
    // Values outside int32 become an out-of-range id, rejected or skipped downstream.
    dst[i] = (src[i] < -1 || src[i] > std::numeric_limits<int32_t>::max())
                 ? std::numeric_limits<int32_t>::max()
                 : static_cast<int32_t>(src[i]);
  }
}

}  // namespace moekit
