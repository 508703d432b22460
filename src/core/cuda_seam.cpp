#include "core/cuda_seam.h"

#include <fmt/format.h>

#include "moekit/core/error.h"

namespace moekit {

void throw_no_cuda(std::string_view what) {
  throw UnsupportedError(fmt::format("moekit: {} needs CUDA; moekit was built without CUDA", what));
}

}  // namespace moekit
