// The NCCL communicator (comm/nccl.h) on the GPU with one rank (what one GPU allows: NCCL refuses
// two ranks on one device), bootstrapped over a SingleRankCommunicator (no MPI): every collective
// on device buffers against what was sent, every dtype for data movement and the sums' dtypes,
// uneven all_to_all_v counts, a CUDA-graph capture, and bad arguments refused before NCCL runs.
// And the all-gather and all-to-all prepare/finalize on GPU ranks through it: a layer with each
// forced gives bitwise the output of the same layer without exchange (bf16, and fp8 quantized after
// the exchange), also at M = 0; and the low-latency one (batched experts): bitwise the same batched
// experts behind the local scatter (bf16, and fp8 with its codes and scales exchanged), also at
// M = 0, and captured in a CUDA graph.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "graph_replay.h"
#include "moekit/comm/nccl.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/moe_layer.h"
#include "require_gpu.h"
#include "testing.h"

namespace moekit {
namespace {

std::shared_ptr<Communicator> one_rank_nccl() {
  static std::shared_ptr<Communicator> comm =
      make_nccl_communicator(std::make_shared<SingleRankCommunicator>(), 0);
  return comm;
}

#define REQUIRE_NCCL()                                              \
  REQUIRE_SM90_GPU();                                               \
  if (!nccl_available()) GTEST_SKIP() << nccl_unavailable_reason(); \
  std::shared_ptr<Communicator> comm = one_rank_nccl();             \
  CudaStream stream_owner(0);                                       \
  const Stream stream = stream_owner.get();                         \
  (void)stream

Tensor on_gpu(const Tensor& t) {
  return t.to(Device::cuda(0));
}

Tensor poisoned_gpu(const Shape& shape, DType dtype) {
  return on_gpu(testing::poisoned(shape, dtype));
}

Tensor host(const Tensor& t, Stream stream) {
  synchronize(stream);
  return t.to(Device::cpu());
}

// The two layers' outputs for the same random M tokens: bitwise equal, no NaN (a and b start
// poisoned, so unwritten rows show).
void expect_same_output(MoELayer& exchanged, MoELayer& local, const ModelPreset& model, int64_t M,
                        uint64_t seed, Stream stream) {
  SCOPED_TRACE(M);
  const Tensor x = on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, seed));
  const Tensor logits =
      on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, seed + 1));
  Tensor a = poisoned_gpu({M, model.hidden_size}, DType::kBF16);
  Tensor b = poisoned_gpu({M, model.hidden_size}, DType::kBF16);
  exchanged.forward_into(a, x, logits, {stream, nullptr});
  local.forward_into(b, x, logits, {stream, nullptr});
  const Tensor ha = host(a, stream), hb = host(b, stream);
  EXPECT_FALSE(testing::has_nan(ha));
  EXPECT_TRUE(testing::bitwise_equal(ha, hb));
}

TEST(NcclComm, OneRankOnTheGpu) {
  REQUIRE_NCCL();
  EXPECT_EQ(comm->name(), "nccl");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->device(), Device::cuda(0));
  EXPECT_EQ(comm->all_gather_host(42), (std::vector<int64_t>{42}));
  comm->barrier();
}

TEST(NcclComm, AllGatherMovesEveryDtype) {
  REQUIRE_NCCL();
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kInt32, DType::kUInt8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor src = testing::random_tensor({7, 5}, DType::kF32, 3).to_dtype(dt);
    const Tensor send = on_gpu(src);
    Tensor recv = poisoned_gpu({7, 5}, dt);
    comm->all_gather(send, recv, stream);
    EXPECT_TRUE(testing::bitwise_equal(host(recv, stream), src));
  }
}

TEST(NcclComm, SumsInTheirDtypes) {
  REQUIRE_NCCL();
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor src = testing::random_tensor({4, 6}, DType::kF32, 5, -50.f, 50.f).to_dtype(dt);
    Tensor recv = poisoned_gpu({4, 6}, dt);
    comm->reduce_scatter(on_gpu(src), recv, stream);
    EXPECT_TRUE(testing::bitwise_equal(host(recv, stream), src));  // one rank: the sum of one
    Tensor inout = on_gpu(src);
    comm->all_reduce(inout, stream);
    EXPECT_TRUE(testing::bitwise_equal(host(inout, stream), src));
  }
  Tensor bytes = on_gpu(Tensor::zeros({4}, DType::kUInt8));
  EXPECT_TRUE(testing::contains_all(testing::error_of([&] { comm->all_reduce(bytes, stream); }),
                                    {"NCCL sums", "uint8"}));
}

TEST(NcclComm, AllToAllVWithUnevenAndZeroCounts) {
  REQUIRE_NCCL();
  const Tensor src = testing::random_tensor({6, 3}, DType::kBF16, 9);
  for (const int64_t n : {int64_t{0}, int64_t{4}, int64_t{6}}) {
    SCOPED_TRACE(n);
    Tensor recv = poisoned_gpu({6, 3}, DType::kBF16);
    comm->all_to_all_v(on_gpu(src), {n}, recv, {n}, stream);
    const Tensor got = host(recv, stream);
    EXPECT_TRUE(testing::bitwise_equal(got.slice(0, 0, n), src.slice(0, 0, n)));
    EXPECT_TRUE(testing::has_nan(got.slice(0, n, 6)) || n == 6) << "rows past the count written";
  }
  // A started exchange (the default: completed at once) gives the same rows.
  Tensor recv = poisoned_gpu({6, 3}, DType::kBF16);
  comm->all_to_all_v_start(on_gpu(src), {6}, recv, {6}, stream)->wait();
  EXPECT_TRUE(testing::bitwise_equal(host(recv, stream), src));
}

TEST(NcclComm, CapturedInACudaGraph) {
  REQUIRE_NCCL();
  const Tensor src = testing::random_tensor({8, 16}, DType::kF32, 11);
  const Tensor send = on_gpu(src);
  Tensor gathered = poisoned_gpu({8, 16}, DType::kF32);
  Tensor summed = poisoned_gpu({8, 16}, DType::kF32);
  auto s = static_cast<cudaStream_t>(stream.handle);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  comm->all_gather(send, gathered, stream);
  comm->reduce_scatter(gathered, summed, stream);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  EXPECT_TRUE(testing::bitwise_equal(host(summed, stream), src));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(NcclComm, BadArgumentsAreRefusedBeforeNccl) {
  REQUIRE_NCCL();
  const Tensor cpu = testing::random_tensor({2, 2}, DType::kF32, 1);
  Tensor gpu = poisoned_gpu({2, 2}, DType::kF32);
  EXPECT_TRUE(testing::contains_all(testing::error_of([&] { comm->all_gather(cpu, gpu, stream); }),
                                    {"send", "cuda"}));
  Tensor wrong_rows = poisoned_gpu({3, 2}, DType::kF32);
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { comm->all_gather(on_gpu(cpu), wrong_rows, stream); }),
      {"all_gather over 1 ranks"}));
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { comm->all_to_all_v(on_gpu(cpu), {3}, gpu, {3}, stream); }),
      {"the counts need 3 send rows"}));
}

TEST(NcclExchangeLayer, BitwiseTheLayerWithoutExchange) {
  REQUIRE_NCCL();
  const ModelPreset model = find_preset("small-deepseek");
  for (const char* scheme : {"bf16", "fp8_block128"}) {
    for (const char* pf : {"allgather_reducescatter", "naive_allgather", "all2all"}) {
      SCOPED_TRACE(std::string(scheme) + " " + pf);
      MoELayerOptions plain;
      plain.device = default_device_info();
      plain.max_num_tokens = 64;
      // Under EP the shared experts run as their own pass: compare with that pass (unfolded).
      plain.shared_experts = SharedExpertsMode::kSeparate;
      MoELayerOptions ep = plain;
      ep.parallel.use_ep = true;
      ep.communicator = comm;
      ep.prepare_finalize = pf;
      MoELayer exchanged = random_quantized_layer(model, scheme, ep, 3);
      MoELayer local = random_quantized_layer(model, scheme, plain, 3);
      EXPECT_EQ(exchanged.plan().prepare_finalize->name, pf);
      for (const int64_t M : {int64_t{37}, int64_t{0}, int64_t{1}})
        expect_same_output(exchanged, local, model, M, 7, stream);
    }
  }
}

// The all-to-all reads the routing back to the host: a capture is refused with the reason, and
// the stream is usable afterwards.
TEST(NcclExchangeLayer, AllToAllRefusesGraphCapture) {
  REQUIRE_NCCL();
  const ModelPreset model = find_preset("small");
  MoELayerOptions o;
  o.device = default_device_info();
  o.max_num_tokens = 16;
  o.parallel.use_ep = true;
  o.communicator = comm;
  o.prepare_finalize = "all2all";
  MoELayer layer = random_quantized_layer(model, "bf16", o, 3);
  const Tensor x = on_gpu(testing::random_tensor({16, model.hidden_size}, DType::kBF16, 7));
  const Tensor logits = on_gpu(testing::random_tensor({16, model.num_experts}, DType::kF32, 8));
  Tensor out = poisoned_gpu({16, model.hidden_size}, DType::kBF16);
  layer.forward_into(out, x, logits, {stream, nullptr});
  auto s = static_cast<cudaStream_t>(stream.handle);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const std::string error = testing::error_of([&] {
    layer.forward_into(out, x, logits, {stream, nullptr});
  });
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_TRUE(testing::contains_all(error, {"cannot be captured", "batched_low_latency"})) << error;
  Tensor again = poisoned_gpu({16, model.hidden_size}, DType::kBF16);
  layer.forward_into(again, x, logits, {stream, nullptr});
  EXPECT_TRUE(testing::bitwise_equal(host(again, stream), host(out, stream)));
}

// bf16, fp8 with 1x128 groups (codes and scales travel) and fp8 per tensor (rows travel, the
// received batch is quantized): bitwise the same batched experts behind the local scatter.
TEST(NcclLowLatencyLayer, BitwiseTheBatchedExpertsWithoutExchange) {
  REQUIRE_NCCL();
  const std::pair<const char*, const char*> schemes[] = {{"bf16", "sm90_batched"},
                                                         {"fp8_block128", "sm90_fp8_batched"},
                                                         {"fp8_per_tensor", "sm90_fp8_batched"}};
  for (const auto& [scheme, backend] : schemes) {
    for (const char* name : {"small-deepseek", "small"}) {
      SCOPED_TRACE(fmt::format("{} {}", scheme, name));
      const ModelPreset model = find_preset(name);
      MoELayerOptions plain;
      plain.device = default_device_info();
      plain.max_num_tokens = 48;
      plain.backend = backend;
      plain.shared_experts = SharedExpertsMode::kSeparate;
      MoELayerOptions ep = plain;
      ep.parallel.use_ep = true;
      ep.communicator = comm;
      ep.prepare_finalize = "batched_low_latency";
      ep.backend = "auto";  // the oracle's choice under the exchange: the same batched experts
      MoELayer exchanged = random_quantized_layer(model, scheme, ep, 5);
      MoELayer local = random_quantized_layer(model, scheme, plain, 5);
      EXPECT_EQ(exchanged.plan().prepare_finalize->name, "batched_low_latency");
      EXPECT_EQ(local.plan().prepare_finalize->name, "batched_local");
      EXPECT_EQ(exchanged.kernel().fused_experts().name(), local.kernel().fused_experts().name());
      for (const int64_t M : {int64_t{48}, int64_t{0}, int64_t{1}, int64_t{17}})
        expect_same_output(exchanged, local, model, M, 9 + static_cast<uint64_t>(M), stream);
      testing::expect_graph_replay_bitwise(exchanged, 33);
      // More tokens than the fixed buffers hold: refused before anything runs.
      const Tensor x = on_gpu(testing::random_tensor({49, model.hidden_size}, DType::kBF16, 1));
      const Tensor logits = on_gpu(testing::random_tensor({49, model.num_experts}, DType::kF32, 2));
      Tensor out = poisoned_gpu({49, model.hidden_size}, DType::kBF16);
      EXPECT_TRUE(testing::contains_all(testing::error_of([&] {
                                          exchanged.forward_into(out, x, logits, {stream, nullptr});
                                        }),
                                        {"M=49", "max_num_tokens=48"}));
    }
  }
}

}  // namespace
}  // namespace moekit
