// The NCCL communicator (comm/nccl.h) on the GPU with one rank (what one GPU allows: NCCL refuses
// two ranks on one device), bootstrapped over a SingleRankCommunicator (no MPI): every collective
// on device buffers against what was sent, every dtype for data movement and the sums' dtypes,
// uneven all_to_all_v counts, a CUDA-graph capture, and bad arguments refused before NCCL runs.
// And the all-gather and all-to-all prepare/finalize on GPU ranks through it: a layer with each
// forced gives bitwise the output of the same layer without exchange (bf16, and fp8 quantized after
// the exchange), also at M = 0; and the low-latency one (batched experts, assembled by hand: one
// rank plans no batched format): bitwise the same batched experts behind the local scatter (bf16,
// and fp8 with its codes and scales exchanged), also at M = 0, and captured in a CUDA graph.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "graph_replay.h"
#include "moekit/comm/nccl.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/exchange.h"
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

// The low-latency exchange over the one-rank NCCL communicator against the local scatter
// (PrepareFinalizeBatched), each with the same batched experts on one layer's weights: bf16,
// fp8 with 1x128 groups (codes and scales travel) and fp8 per tensor (rows travel, the received
// batch is quantized), bitwise, at M = 48 (the capacity), 0, 1, 17, and captured in a CUDA graph.
// One rank keeps the standard format (the oracle gives batched experts to DP + EP ranks only), so
// the pairs are assembled here.
TEST(NcclLowLatencyKernel, BitwiseTheLocalScatter) {
  REQUIRE_NCCL();
  constexpr int64_t kCapacity = 48;
  const std::pair<const char*, const ExpertsClass*> schemes[] = {
      {"bf16", &Sm90BatchedExperts::klass()},
      {"fp8_block128", &Sm90BatchedFp8Experts::klass()},
      {"fp8_per_tensor", &Sm90BatchedFp8Experts::klass()}};
  for (const auto& [scheme, klass] : schemes) {
    for (const char* name : {"small-deepseek", "small"}) {
      SCOPED_TRACE(fmt::format("{} {}", scheme, name));
      const ModelPreset model = find_preset(name);
      MoELayerOptions o;
      o.device = default_device_info();
      o.max_num_tokens = kCapacity;
      MoELayer layer = random_quantized_layer(model, scheme, o, 5);
      const MoEConfig& moe = layer.moe_config();
      const QuantConfig& quant = layer.quant_config();
      auto exchanged = assemble_moe_kernel(
          quant, moe, *klass,
          std::make_unique<PrepareFinalizeLowLatency>(comm.get(), model.num_experts, kCapacity));
      auto local = assemble_moe_kernel(quant, moe, *klass,
                                       std::make_unique<PrepareFinalizeBatched>(
                                           kCapacity, static_cast<int>(moe.num_local_experts)));
      EXPECT_EQ(exchanged->fused_experts().name(), klass->name());
      WorkspaceManager ws_a(comm->device()), ws_b(comm->device());
      auto args_for = [&](int64_t M, uint64_t seed) {
        Tensor ids, weights;
        testing::random_routing(M, model.top_k, model.num_experts, seed, &ids, &weights);
        ModularApplyArgs args;
        args.hidden_states =
            on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, seed + 1));
        args.w1 = layer.kernel_weights().w13;
        args.w2 = layer.kernel_weights().w2;
        args.topk_ids = on_gpu(ids);
        args.topk_weights = on_gpu(weights);
        args.activation = model.activation;
        args.global_num_experts = model.num_experts;
        args.output = poisoned_gpu({M, model.hidden_size}, DType::kBF16);
        return args;
      };
      for (const int64_t M : {kCapacity, int64_t{0}, int64_t{1}, int64_t{17}}) {
        SCOPED_TRACE(M);
        ModularApplyArgs a = args_for(M, 9 + static_cast<uint64_t>(M));
        ModularApplyArgs b = a;
        b.output = poisoned_gpu({M, model.hidden_size}, DType::kBF16);
        exchanged->apply(a, {stream, &ws_a});
        local->apply(b, {stream, &ws_b});
        const Tensor ha = host(a.output, stream), hb = host(b.output, stream);
        EXPECT_FALSE(testing::has_nan(ha));
        EXPECT_TRUE(testing::bitwise_equal(ha, hb));
      }
      testing::expect_apply_replay_bitwise(*exchanged, args_for(33, 3), {stream, &ws_a});
      // More tokens than the fixed buffers hold: refused before anything runs.
      EXPECT_TRUE(testing::contains_all(testing::error_of([&] {
                                          exchanged->apply(args_for(49, 1), {stream, &ws_a});
                                        }),
                                        {"49", "48"}));
    }
  }
}

}  // namespace
}  // namespace moekit
