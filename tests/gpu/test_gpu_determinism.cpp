// Determinism and batch invariance on the GPU: 20 runs of the same inputs are bitwise identical,
// and in batch-invariant mode a token's output is bitwise the same alone and inside batches of
// several sizes (across the decode / prefill tile switch of the grouped GEMM).
#include <gtest/gtest.h>

#include <cstdio>

#include "invariance.h"
#include "moekit/layer/moe_layer.h"
#include "require_gpu.h"

namespace moekit {
namespace {

class GpuInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuInvariance, DeterministicOverTwentyRunsAndBatchInvariant) {
  REQUIRE_SM90_GPU();
  const ModelPreset& model = find_preset(GetParam());
  for (const bool mode : {true, false}) {
    SCOPED_TRACE(mode ? "batch-invariant mode" : "default mode");
    MoELayerOptions o;
    o.device = default_device_info();
    o.batch_invariant = mode;
    o.max_num_tokens = 4096;
    MoELayer layer(model, MoELayer::random_weights(model, o, 5), o);
    EXPECT_TRUE(testing::deterministic(layer, 1, 20, 21));
    EXPECT_TRUE(testing::deterministic(layer, 777, 20, 23));
    const ::testing::AssertionResult invariant =
        testing::batch_invariant(layer, {2, 7, 33, 300, 4096}, 6, 29);
    if (mode) {
      EXPECT_TRUE(invariant);
    } else {
      std::printf("[invariance] %s default mode: %s\n", model.name.c_str(),
                  invariant ? "batch invariant as well" : invariant.message());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuInvariance,
                         ::testing::Values("small", "small-deepseek", "small-gpt-oss",
                                           "small-qwen2-moe", "qwen3-30b-a3b"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace moekit
