#include "moekit/core/checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace moekit {

void expect_defined(const Tensor& t, std::string_view name) {
  MOEKIT_CHECK(t.defined(), "tensor '{}' is required but was not given", name);
}

void expect_dtype(const Tensor& t, std::string_view name, std::initializer_list<DType> allowed) {
  expect_defined(t, name);
  for (DType d : allowed) {
    if (t.dtype() == d) return;
  }
  std::vector<std::string_view> names;
  for (DType d : allowed)
    names.push_back(dtype_name(d));
  MOEKIT_CHECK(false, "tensor '{}' has dtype {} but must be one of [{}]", name,
               dtype_name(t.dtype()), fmt::join(names, ", "));
}

void expect_dim(const Tensor& t, std::string_view name, int dim) {
  expect_defined(t, name);
  MOEKIT_CHECK(t.dim() == dim, "tensor '{}' has shape {} ({}-d) but must be {}-d", name,
               shape_to_string(t.shape()), t.dim(), dim);
}

void expect_shape(const Tensor& t, std::string_view name, std::initializer_list<int64_t> expected) {
  expect_dim(t, name, static_cast<int>(expected.size()));
  int d = 0;
  bool ok = true;
  for (int64_t e : expected) {
    if (e != kAnyDim && t.shape()[d] != e) ok = false;
    ++d;
  }
  if (ok) return;
  std::vector<std::string> parts;
  for (int64_t e : expected)
    parts.push_back(e == kAnyDim ? std::string("*") : std::to_string(e));
  MOEKIT_CHECK(false, "tensor '{}' has shape {} but must have shape [{}]", name,
               shape_to_string(t.shape()), fmt::join(parts, ", "));
}

void expect_device(const Tensor& t, std::string_view name, Device device) {
  expect_defined(t, name);
  MOEKIT_CHECK(t.device() == device, "tensor '{}' is on {} but must be on {}", name,
               t.device().to_string(), device.to_string());
}

void expect_contiguous(const Tensor& t, std::string_view name) {
  expect_defined(t, name);
  MOEKIT_CHECK(t.is_contiguous(), "tensor '{}' ({}) must be contiguous", name, t.describe());
}

void expect_tensor(const Tensor& t, std::string_view name, std::initializer_list<int64_t> shape,
                   std::initializer_list<DType> dtypes, Device device) {
  expect_shape(t, name, shape);
  expect_dtype(t, name, dtypes);
  expect_device(t, name, device);
  expect_contiguous(t, name);
}

}  // namespace moekit
