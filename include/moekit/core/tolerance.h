// The one table of numerical tolerances: how far a layer's output may be from a float64
// recomputation, per dtype and per quantization scheme. Tests, `moekit run` and the GPU checks all
// read it here.
#pragma once

#include <string_view>

#include "moekit/core/dtype.h"

namespace moekit {

struct Tolerance {
  std::string_view name;
  double rel_l2;    // ||out - ref||_2 / ||ref||_2
  double abs_elem;  // per element: |out - ref| <= abs_elem + rel_elem * |ref|
  double rel_elem;
};

// "f32", "f16", "bf16", "fp8_w8a8", "fp8_w8a8_gpu", "int8_w8a8", "int8_w8a8_gpu", "mxfp4",
// "mxfp4_w4a16_gpu", "nvfp4", "nvfp4_w4a16_gpu", "mxfp6", "w4a8", "w4a8_gpu", "int4_w4a16",
// "bf16_ep_gpu". Throws
// moekit::Error for an unknown name.
const Tolerance& tolerance(std::string_view name);
const Tolerance& tolerance_for(DType dtype);

}  // namespace moekit
