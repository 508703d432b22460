// The token-exchanging prepare/finalize (prepare_finalize/exchange.h) on one rank, forced by name
// (MoELayerOptions::prepare_finalize) over a SingleRankCommunicator: a layer through each gives
// bitwise the output of the same layer through no_ep (one rank's partials are the whole sum,
// rounded once either way), with shared experts and an idle forward; and the forcing itself (an
// unknown name, a forced factory whose check fails). The multi-rank runs, the low-latency one
// included (the oracle gives batched experts only to multi-rank DP + EP), are tests/mpi.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "moekit/experts/cpu_reference.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/exchange.h"
#include "testing.h"

namespace moekit {
namespace {

struct Forced {
  const char* prepare_finalize;
  const char* backend;  // the experts it needs ("auto": the standard format)
};

MoELayerOptions one_rank(const Forced& f) {
  MoELayerOptions o;
  o.parallel.use_ep = true;  // EP over a single rank: ep_size = dp_size = 1
  o.communicator = std::make_shared<SingleRankCommunicator>();
  o.prepare_finalize = f.prepare_finalize;
  o.backend = f.backend;
  o.max_num_tokens = 40;
  return o;
}

class ExchangeOneRank : public ::testing::TestWithParam<Forced> {};

TEST_P(ExchangeOneRank, BitwiseTheLayerWithoutExchange) {
  const Forced& f = GetParam();
  for (const char* name : {"small-deepseek", "small-gpt-oss"}) {
    SCOPED_TRACE(name);
    const ModelPreset model = find_preset(name);
    const MoELayerOptions o = one_rank(f);
    MoELayerOptions plain;
    plain.backend = f.backend;
    plain.max_num_tokens = o.max_num_tokens;
    MoELayer exchanged(model, MoELayer::random_weights(model, o, 2), o);
    MoELayer local(model, MoELayer::random_weights(model, plain, 2), plain);
    EXPECT_EQ(exchanged.plan().prepare_finalize->name, f.prepare_finalize);
    for (const int64_t M : {int64_t{33}, int64_t{0}, int64_t{1}}) {
      SCOPED_TRACE(M);
      const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, 3 + M);
      const Tensor logits = testing::random_tensor({M, model.num_experts}, DType::kF32, 4 + M);
      Tensor out = testing::poisoned({M, model.hidden_size}, DType::kBF16);
      exchanged.forward_into(out, x, logits, {});
      EXPECT_TRUE(testing::bitwise_equal(out, local.forward(x, logits)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forced, ExchangeOneRank,
                         ::testing::Values(Forced{"naive_allgather", "auto"},
                                           Forced{"allgather_reducescatter", "auto"},
                                           Forced{"all2all", "auto"}),
                         [](const auto& info) { return std::string(info.param.prepare_finalize); });

TEST(ExchangeOneRank, ForcingNamesTheProblem) {
  const ModelPreset model = find_preset("small");
  MoELayerOptions o = one_rank({"no_such_pf", "auto"});
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { MoELayer(model, MoELayer::random_weights(model, o, 1), o); }),
      {"unknown prepare/finalize 'no_such_pf'", "allgather_reducescatter", "no_ep"}));
  // The low-latency one needs batched experts; the default experts take the standard format.
  o = one_rank({"batched_low_latency", "auto"});
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { MoELayer(model, MoELayer::random_weights(model, o, 1), o); }),
      {"batched_low_latency", "takes the standard format"}));
  // Without a communicator.
  o = one_rank({"all2all", "auto"});
  o.communicator = nullptr;
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { MoELayer(model, MoELayer::random_weights(model, o, 1), o); }),
      {"all2all", "needs a communicator of 1 ranks"}));
}

// The low-latency exchange assembled by hand with batched experts (what one rank cannot plan):
// bitwise the same experts behind the local scatter, on the CPU (tests/gpu/test_gpu_comm_nccl.cpp
// runs the same pair on GPU ranks), and more tokens than its capacity refused with both numbers.
TEST(ExchangeOneRank, LowLatencyKernelBitwiseTheLocalScatter) {
  constexpr int64_t kCapacity = 24;
  const ModelPreset model = find_preset("small-deepseek");
  MoELayerOptions o;
  o.max_num_tokens = kCapacity;
  MoELayer layer(model, MoELayer::random_weights(model, o, 6), o);
  const MoEConfig& moe = layer.moe_config();
  SingleRankCommunicator comm;
  auto exchanged = assemble_moe_kernel(
      layer.quant_config(), moe, CpuBatchedReferenceExperts::klass(),
      std::make_unique<PrepareFinalizeLowLatency>(&comm, model.num_experts, kCapacity));
  auto local = assemble_moe_kernel(
      layer.quant_config(), moe, CpuBatchedReferenceExperts::klass(),
      std::make_unique<PrepareFinalizeBatched>(kCapacity, static_cast<int>(moe.num_local_experts)));
  auto args_for = [&](int64_t M, uint64_t seed) {
    ModularApplyArgs args;
    testing::random_routing(M, model.top_k, model.num_experts, seed, &args.topk_ids,
                            &args.topk_weights);
    args.hidden_states = testing::random_tensor({M, model.hidden_size}, DType::kBF16, seed + 1);
    args.w1 = layer.kernel_weights().w13;
    args.w2 = layer.kernel_weights().w2;
    args.activation = model.activation;
    args.global_num_experts = model.num_experts;
    args.output = testing::poisoned({M, model.hidden_size}, DType::kBF16);
    return args;
  };
  for (const int64_t M : {kCapacity, int64_t{0}, int64_t{1}, int64_t{17}}) {
    SCOPED_TRACE(M);
    ModularApplyArgs a = args_for(M, 9 + static_cast<uint64_t>(M));
    ModularApplyArgs b = a;
    b.output = testing::poisoned({M, model.hidden_size}, DType::kBF16);
    exchanged->apply(a, {});
    local->apply(b, {});
    EXPECT_FALSE(testing::has_nan(a.output));
    EXPECT_TRUE(testing::bitwise_equal(a.output, b.output));
  }
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { exchanged->apply(args_for(kCapacity + 1, 1), {}); }),
      {"M = 25", "max_tokens_per_rank = 24"}));
}

}  // namespace
}  // namespace moekit
