// Device memory of a layer: the routed experts' weights are held once (rewritten in place into the
// kernel's layout, not copied), so a layer costs its weight bytes + its reported workspace + a
// small fixed slack — measured with cudaMemGetInfo around the construction of a real-shape layer.
#include <gtest/gtest.h>

#include <cstdio>

#include "moekit/layer/moe_layer.h"
#include "require_gpu.h"
#include "testing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {
namespace {

#ifdef MOEKIT_WITH_CUDA
size_t bytes_of(const Tensor& t) {
  return t.defined() ? t.nbytes() : 0;
}

size_t device_bytes_in_use() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return total - free;
}
#endif

TEST(GpuLayerMemory, WeightsAreHeldOnce) {
  REQUIRE_SM90_GPU();
#ifdef MOEKIT_WITH_CUDA
  // deepseek-v3 (22.5 GB of experts) and gpt-oss-120b (biases, swigluoai pairwise layout): both
  // take the fused-activation layout, which used to be a second copy of w13.
  for (const char* name : {"deepseek-v3", "gpt-oss-120b"}) {
    SCOPED_TRACE(name);
    const ModelPreset& model = find_preset(name);
    MoELayerOptions opt;
    opt.device = default_device_info();
    opt.max_num_tokens = 1024;
    const size_t before = device_bytes_in_use();
    MoELayerWeights w = MoELayer::random_weights(model, opt, 3);
    const size_t given = bytes_of(w.w13) + bytes_of(w.w2) + bytes_of(w.w13_bias) +
                         bytes_of(w.w2_bias) + bytes_of(w.e_score_correction_bias) +
                         bytes_of(w.shared_w13) + bytes_of(w.shared_w2) + bytes_of(w.shared_gate);
    const void* w13_data = w.w13.data();
    MoELayer layer(model, std::move(w), opt);
    const size_t used = device_bytes_in_use() - before;
    // Folded shared experts need one tensor with room for their chunks: w13 is copied once (and
    // the given one released); otherwise it is rewritten in place.
    if (layer.shared_chunks() == 0) {
      EXPECT_EQ(layer.kernel_weights().w13.data(), w13_data) << "w13 was copied, not rewritten";
    }
    ASSERT_TRUE(layer.plan().weight_layout.has_value()) << "expected the fused-activation layout";
    const size_t workspace = layer.workspace().total_bytes();
    const size_t routing = static_cast<size_t>(opt.max_num_tokens) * model.top_k * 8;
    constexpr size_t kSlack = 64u << 20;
    std::printf(
        "[memory] %s: device bytes used %.3f GB = weights %.3f GB + workspace %.3f GB + "
        "%.1f MB other (slack allowed %.0f MB)\n",
        name, used / 1e9, given / 1e9, workspace / 1e9,
        (static_cast<double>(used) - given - workspace) / 1e6, kSlack / 1e6);
    EXPECT_LE(used, given + workspace + routing + kSlack);
  }
#endif
}

}  // namespace
}  // namespace moekit
