// Determinism and batch invariance on the CPU (the GPU counterpart: tests/gpu/
// test_gpu_determinism.cpp): a token's output is bitwise the same alone and inside batches of
// several sizes, and repeated runs are bitwise identical, for every preset family.
#include <gtest/gtest.h>

#include <cstdlib>

#include "invariance.h"
#include "moekit/layer/moe_layer.h"

namespace moekit {
namespace {

class CpuInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuInvariance, BatchInvariantAndDeterministic) {
  const ModelPreset& model = find_preset(GetParam());
  MoELayerOptions o;
  o.batch_invariant = true;
  o.max_num_tokens = 300;
  MoELayer layer(model, MoELayer::random_weights(model, o, 5), o);
  EXPECT_TRUE(layer.moe_config().batch_invariant);
  EXPECT_TRUE(testing::batch_invariant(layer, {2, 7, 33, 300}, 4, 17));
  EXPECT_TRUE(testing::deterministic(layer, 64, 5, 19));
}

INSTANTIATE_TEST_SUITE_P(Presets, CpuInvariance,
                         ::testing::Values("small", "small-deepseek", "small-gpt-oss",
                                           "small-qwen2-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(BatchInvariantMode, TheEnvironmentVariableTurnsItOn) {
  const ModelPreset& model = find_preset("tiny");
  MoELayerOptions o;
  EXPECT_FALSE(MoELayer::make_moe_config(model, o).batch_invariant);
  ::setenv(kBatchInvariantEnvVar, "1", 1);
  EXPECT_TRUE(MoELayer::make_moe_config(model, o).batch_invariant);
  ::setenv(kBatchInvariantEnvVar, "sometimes", 1);
  EXPECT_TRUE(
      testing::contains_all(testing::error_of([&] { (void)MoELayer::make_moe_config(model, o); }),
                            {kBatchInvariantEnvVar, "sometimes"}));
  ::unsetenv(kBatchInvariantEnvVar);
}

}  // namespace
}  // namespace moekit
