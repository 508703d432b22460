// The one seam between host code and device code.
//
// Device entry points are declared in their stage's cuda/ header (src/<stage>/cuda/*.h) using only
// moekit types, and defined only in .cu files, which the build compiles only with CUDA. Host code
// reaches them through
//
//   if constexpr (kCudaBuild) {
//     route_on_device_into(...);
//   } else {
//     throw_no_cuda("the GPU router");
//   }
//
// NOTE: an entry point odr-used only in a discarded statement needs no definition
// ([basic.def.odr]), so a build without CUDA links without stub files.
#pragma once

#include <string_view>

namespace moekit {

#ifdef MOEKIT_WITH_CUDA
inline constexpr bool kCudaBuild = true;
#else
inline constexpr bool kCudaBuild = false;
#endif

// Throws moekit::UnsupportedError("moekit: <what> needs CUDA; moekit was built without CUDA").
[[noreturn]] void throw_no_cuda(std::string_view what);

}  // namespace moekit
