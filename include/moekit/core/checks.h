// Argument checks that name the tensor, the value and the requirement.
#pragma once

#include <initializer_list>
#include <string_view>

#include "moekit/core/error.h"
#include "moekit/core/tensor.h"

namespace moekit {

// Wildcard for expect_shape.
inline constexpr int64_t kAnyDim = -1;

void expect_defined(const Tensor& t, std::string_view name);
void expect_dtype(const Tensor& t, std::string_view name, std::initializer_list<DType> allowed);
void expect_dim(const Tensor& t, std::string_view name, int dim);
// Each expected entry is a size or kAnyDim.
void expect_shape(const Tensor& t, std::string_view name, std::initializer_list<int64_t> expected);
void expect_device(const Tensor& t, std::string_view name, Device device);
void expect_contiguous(const Tensor& t, std::string_view name);
// All four: the shape (kAnyDim matches any size), one of the dtypes, the device, contiguous.
void expect_tensor(const Tensor& t, std::string_view name, std::initializer_list<int64_t> shape,
                   std::initializer_list<DType> dtypes, Device device);

}  // namespace moekit
