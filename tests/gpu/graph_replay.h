// A whole layer's forward_into (router, experts, shared experts) captured in a CUDA graph and
// replayed gives bitwise the output of a direct call: the forward allocates nothing, never
// synchronizes, and reads no host state that capture would freeze.
#pragma once

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "moekit/layer/moe_layer.h"
#include "moekit/modular/kernel.h"
#include "testing.h"

namespace moekit::testing {

// enqueue() captured on `stream` in a CUDA graph, the graph replayed three times, then the
// stream synchronised.
template <typename Enqueue>
void replay_captured(Stream stream, Enqueue&& enqueue) {
  auto s = static_cast<cudaStream_t>(stream.handle);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  enqueue();
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

inline void expect_graph_replay_bitwise(MoELayer& layer, int64_t M) {
  const ModelPreset& m = layer.model();
  const Device gd = layer.moe_config().device.device();
  const Tensor x = random_tensor({M, m.hidden_size}, DType::kBF16, 1).to(gd);
  const Tensor logits = random_tensor({M, m.num_experts}, DType::kF32, 2).to(gd);
  Tensor direct = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
  Tensor replayed = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
  RunContext ctx{layer.default_stream(), nullptr};
  layer.forward_into(direct, x, logits, ctx);
  synchronize(ctx.stream);
  replayed.fill_bytes(0xFF);
  replay_captured(ctx.stream, [&] { layer.forward_into(replayed, x, logits, ctx); });
  const auto a = direct.to(Device::cpu()), b = replayed.to(Device::cpu());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
}

// The same for a kernel assembled by hand (a pair no one-rank layer plans): args.output (on the
// GPU) takes a direct call's output, then a poisoned copy the replays' of the captured apply.
inline void expect_apply_replay_bitwise(FusedMoEKernel& kernel, ModularApplyArgs args,
                                        RunContext ctx) {
  const Tensor direct = args.output;
  kernel.apply(args, ctx);
  synchronize(ctx.stream);
  Tensor replayed = Tensor::empty(direct.shape(), direct.dtype(), direct.device());
  replayed.fill_bytes(0xFF);
  args.output = replayed;
  replay_captured(ctx.stream, [&] { kernel.apply(args, ctx); });
  EXPECT_TRUE(bitwise_equal(direct.to(Device::cpu()), replayed.to(Device::cpu())));
}

}  // namespace moekit::testing
#endif
