// The GPU tests' precondition: a Hopper (sm_90) GPU. REQUIRE_SM90_GPU() skips the test with the
// reason (no GPU, or which device was found) instead of failing on a machine without one.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moekit/core/device.h"

namespace moekit::testing {

// "" when a Hopper GPU is present, else why not.
inline std::string sm90_gpu_unavailable() {
  if (cuda_device_count() == 0) return "no GPU: " + cuda_unavailable_reason();
  const DeviceInfo d = default_device_info();
  if (d.compute_capability != 90) return "needs sm_90 (Hopper), found " + d.to_string();
  return "";
}

}  // namespace moekit::testing

#define REQUIRE_SM90_GPU()                                                                   \
  do {                                                                                       \
    if (const std::string why_ = ::moekit::testing::sm90_gpu_unavailable(); !why_.empty()) { \
      GTEST_SKIP() << why_;                                                                  \
    }                                                                                        \
  } while (false)
