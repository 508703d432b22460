// Expert parallelism across CPU ranks under mpirun with 2 and 4 processes (ctest label mpi): the
// token-exchanging prepare/finalize (prepare_finalize/exchange.h) inside a DP + EP MoELayer, each
// rank's output against a single-rank layer holding every expert (built on every rank from the
// same seed: rank r's experts are a slice of it). Uneven token counts with an idle rank, ids of
// -1, shared experts, quantized dispatch (per-token / per-group scales travel with the rows; a
// dynamic per-tensor scale is taken after the exchange), the async hook/receiver protocol, and the
// reasons a deployment is refused. The same on GPU ranks over NCCL with MOEKIT_EP_TEST_DEVICE=cuda
// (one GPU per rank).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "moekit/comm/mpi.h"
#include "moekit/comm/nccl.h"
#include "moekit/config/quant_factories.h"
#include "moekit/core/tolerance.h"
#include "moekit/io/fixtures.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/prepare_finalize/exchange.h"
#include "testing.h"

namespace moekit {
namespace {

// MOEKIT_EP_TEST_DEVICE=cuda: the ranks run on GPUs (rank r on GPU r modulo the visible ones)
// and exchange over NCCL, bootstrapped over MPI (two ranks need two GPUs: NCCL refuses two ranks
// on one; bench/ep_two_gpu_session.sh). The single-rank reference stays on the CPU. Default: CPU
// ranks over MPI (CI).
bool gpu_ranks() {
  static const bool gpu = [] {
    const char* v = std::getenv("MOEKIT_EP_TEST_DEVICE");
    return v != nullptr && std::string(v) == "cuda";
  }();
  return gpu;
}

std::shared_ptr<Communicator> world() {
  if (!mpi_available()) return nullptr;
  static const std::shared_ptr<Communicator> comm =
      gpu_ranks() ? nccl_world_communicator() : mpi_world_communicator();
  return comm;
}

#define REQUIRE_RANKS()                                                \
  std::shared_ptr<Communicator> comm = world();                        \
  if (!comm) GTEST_SKIP() << mpi_unavailable_reason();                 \
  if (comm->world_size() < 2) GTEST_SKIP() << "needs 2 or more ranks"; \
  const int R = comm->rank(), W = comm->world_size();                  \
  (void)R;                                                             \
  (void)W

struct Backend {
  const char* name;              // the --all2all name
  const char* prepare_finalize;  // the factory the plan chooses
};
const Backend kBackends[] = {{"naive", "naive_allgather"},
                             {"allgather_reducescatter", "allgather_reducescatter"},
                             {"nccl_all2all", "all2all"},
                             {"batched_low_latency", "batched_low_latency"}};

// Uneven, rank 1 idle.
int64_t tokens_of_rank(int r) {
  static const int64_t t[] = {5, 0, 17, 3};
  return t[r % 4];
}

constexpr int64_t kMaxTokens = 32;

MoELayerOptions ep_options(const Backend& b, const std::shared_ptr<Communicator>& comm) {
  All2AllBackend key = All2AllBackend::kNaive;
  EXPECT_TRUE(parse_all2all_backend(b.name, &key));
  MoELayerOptions o;
  o.parallel = ParallelConfig::make(1, comm->world_size(), comm->rank(), 0, true, key);
  o.communicator = comm;
  o.max_num_tokens = kMaxTokens;
  if (gpu_ranks()) {
    o.device = default_device_info();
    o.device.index = comm->device().index;
  }
  return o;
}

// ep's output for host x and logits (on its GPU and back, under MOEKIT_EP_TEST_DEVICE=cuda),
// from a poisoned buffer.
Tensor run_ep(MoELayer& ep, const Tensor& x, const Tensor& logits) {
  const Device d = ep.moe_config().device.device();
  Tensor out = testing::poisoned(x.shape(), DType::kBF16);
  if (d.is_cpu()) {
    ep.forward_into(out, x, logits, {});
    return out;
  }
  Tensor on_device = out.to(d);
  ep.forward_into(on_device, x.to(d), logits.to(d), {});  // the layer's stream, synchronised
  return on_device.to(Device::cpu());
}

// The same for routed inputs.
Tensor run_ep_routed(MoELayer& ep, const Tensor& x, const Tensor& ids, const Tensor& weights) {
  const Device d = ep.moe_config().device.device();
  Tensor out = testing::poisoned(x.shape(), DType::kBF16);
  if (d.is_cpu()) {
    ep.forward_routed_into(out, x, ids, weights, {});
    return out;
  }
  Tensor on_device = out.to(d);
  ep.forward_routed_into(on_device, x.to(d), ids.to(d), weights.to(d), {});
  return on_device.to(Device::cpu());
}

MoELayerOptions single_options() {
  MoELayerOptions o;
  o.max_num_tokens = kMaxTokens;
  return o;
}

std::vector<double> as_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();
  return {f.begin(), f.end()};
}

// out vs the single-rank layer's output: on CPU ranks only the f32 summation order differs
// (partials summed across ranks), so they agree to about one bf16 rounding; GPU ranks against
// the CPU layer: the GPU layers' bf16 bound against the CPU reference.
void expect_close(const Tensor& out, const Tensor& ref, double tol = 2e-3) {
  if (gpu_ranks()) tol = std::max(tol, tolerance("bf16").rel_l2);
  ASSERT_EQ(out.shape(), ref.shape());
  EXPECT_FALSE(testing::has_nan(out)) << "unwritten (poisoned) output elements";
  if (ref.numel() == 0) return;
  EXPECT_LE(testing::relative_l2_error(out, as_doubles(ref)), tol);
}

class EpLayer : public ::testing::TestWithParam<Backend> {};

TEST_P(EpLayer, EveryRankMatchesTheSingleRankLayer) {
  REQUIRE_RANKS();
  const Backend& b = GetParam();
  for (const char* name : {"small-deepseek", "small"}) {
    SCOPED_TRACE(name);
    const ModelPreset model = find_preset(name);
    const MoELayerOptions opts = ep_options(b, comm);
    MoELayer ep(model, MoELayer::random_weights(model, opts, 7), opts);
    MoELayer ref(model, MoELayer::random_weights(model, single_options(), 7), single_options());
    EXPECT_EQ(ep.plan().prepare_finalize->name, b.prepare_finalize);
    EXPECT_TRUE(ep.kernel().output_is_reduced());
    // Two forwards with different counts: the state of one does not leak into the next.
    for (int step = 0; step < 2; ++step) {
      const int64_t M = tokens_of_rank(R + step);
      const Tensor x =
          testing::random_tensor({M, model.hidden_size}, DType::kBF16, 100 + 10 * R + step);
      const Tensor logits =
          testing::random_tensor({M, model.num_experts}, DType::kF32, 200 + R + step);
      expect_close(run_ep(ep, x, logits), ref.forward(x, logits));
    }
  }
}

TEST_P(EpLayer, IdsOfMinusOneContributeNothing) {
  REQUIRE_RANKS();
  const Backend& b = GetParam();
  const ModelPreset model = find_preset("small-deepseek");
  const MoELayerOptions opts = ep_options(b, comm);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 11), opts);
  MoELayer ref(model, MoELayer::random_weights(model, single_options(), 11), single_options());
  const int64_t M = tokens_of_rank(R) + 4;
  Tensor ids, weights;
  testing::random_routing(M, model.top_k, model.num_experts, 300 + R, &ids, &weights);
  // Token 0 goes nowhere: its routed output is zero (plus the shared experts).
  testing::drop_some_slots(ids);
  const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, 400 + R);
  expect_close(run_ep_routed(ep, x, ids, weights), ref.forward_routed(x, ids, weights));
}

TEST_P(EpLayer, EveryRankIdle) {
  REQUIRE_RANKS();
  const Backend& b = GetParam();
  const ModelPreset model = find_preset("small");
  const MoELayerOptions opts = ep_options(b, comm);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 3), opts);
  const Tensor x = Tensor::empty({0, model.hidden_size}, DType::kBF16);
  const Tensor logits = Tensor::empty({0, model.num_experts}, DType::kF32);
  EXPECT_EQ(run_ep(ep, x, logits).shape(), (Shape{0, model.hidden_size}));
}

INSTANTIATE_TEST_SUITE_P(Backends, EpLayer, ::testing::ValuesIn(kBackends),
                         [](const auto& info) { return std::string(info.param.name); });

// Quantized dispatch through checkpoints: fixture layers of the tiny DeepSeek model (shared
// expert, grouped routing) loaded as EP ranks and as one rank.
struct QuantCase {
  const char* scheme;
  const char* backend;
  const char* gpu_skip = nullptr;  // why GPU ranks do not run it (no such Hopper experts)
};

class EpQuantized : public ::testing::TestWithParam<QuantCase> {};

TEST_P(EpQuantized, MatchesTheSingleRankLayer) {
  REQUIRE_RANKS();
  const QuantCase& c = GetParam();
  if (gpu_ranks() && c.gpu_skip != nullptr) GTEST_SKIP() << c.gpu_skip;
  const Backend b{c.backend, ""};
  // Every rank writes its own copy (the fixture is deterministic).
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    fmt::format("moekit_ep_{}_{}_{}", c.scheme, getpid(), R);
  io::FixtureOptions f;
  f.scheme = c.scheme;
  f.model = "tiny-deepseek";
  f.seed = 5;
  io::write_fixture_checkpoint(dir, f);
  MoELayer ep = load_moe_layer(dir, 1, ep_options(b, comm));
  MoELayer ref = load_moe_layer(dir, 1, single_options());
  const int64_t H = ep.moe_config().hidden_dim;
  const int64_t M = tokens_of_rank(R);
  const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 500 + R);
  const Tensor logits = ref.router_logits(x);
  const Tensor out = run_ep(ep, x, logits);
  // Per-row scales: the same codes on both sides. A static per-tensor scale is the maximum over
  // the rank's own experts (quantized where the experts are), so it may differ from the single
  // rank's: the scheme's tolerance then.
  const bool per_row = std::string(c.scheme) != "fp8_per_tensor" && !gpu_ranks();
  expect_close(out, ref.forward(x, logits),
               per_row ? 2e-3 : tolerance(ref.tolerance_name()).rel_l2);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, EpQuantized,
    ::testing::Values(
        QuantCase{"fp8_per_channel", "allgather_reducescatter"},
        QuantCase{"fp8_per_channel", "nccl_all2all"}, QuantCase{"fp8_block128", "nccl_all2all"},
        QuantCase{"fp8_per_tensor", "allgather_reducescatter"},
        QuantCase{"int8_w8a8", "nccl_all2all"}, QuantCase{"mxfp4_a4", "allgather_reducescatter"},
        // Batched experts: codes + per-row scales in the
        // fixed-capacity exchange.
        QuantCase{"fp8_per_channel", "batched_low_latency"},
        QuantCase{"fp8_block128", "batched_low_latency"},
        QuantCase{"int8_w8a8", "batched_low_latency", "no batched int8 experts on Hopper"},
        QuantCase{"mxfp4_w4a16", "batched_low_latency", "no batched MXFP4 experts on Hopper"}),
    [](const auto& info) {
      return testing::param_name(std::string(info.param.scheme) + "_" + info.param.backend);
    });

// fp8 weights with a dynamic per-tensor activation scale: the activations travel unquantized and
// the receiving rank quantizes its batch (its scale differs from the single rank's, so the check
// is the fp8 tolerance). Weights: random e4m3 codes of every expert, each rank taking its slice.
TEST(EpQuantizedAfterDispatch, DynamicPerTensorFp8) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small");
  for (const Backend& b : {kBackends[1], kBackends[2]}) {
    SCOPED_TRACE(b.name);
    auto make = [&](const MoELayerOptions& opts) {
      const MoEConfig moe = MoELayer::make_moe_config(model, opts);
      const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
      const int64_t I = moe.intermediate_size_per_partition();
      const int64_t first = moe.parallel.ep_rank * E;
      auto codes = [&](int64_t rows, int64_t cols, uint64_t seed) {
        Tensor all = Tensor::empty({moe.num_experts, rows, cols}, DType::kFp8E4M3);
        std::mt19937_64 rng(seed);
        auto* p = all.data_as<uint8_t>();
        for (int64_t i = 0; i < all.numel(); ++i) {
          p[i] = static_cast<uint8_t>(rng() % 0x70) | (rng() % 2 ? 0x80 : 0);  // |v| < 1, no NaN
        }
        return all.slice(0, first, first + E).clone();
      };
      MoELayerWeights w = MoELayer::random_weights(model, opts, 9, /*routed_experts=*/false);
      w.w13 = codes(2 * I, H, 21);
      w.w2 = codes(H, I, 22);
      Fp8W8A8Params p;
      p.w1_scale =
          Tensor::from_floats(std::vector<float>(static_cast<size_t>(E), 0.5f), {E}, DType::kF32);
      p.w2_scale =
          Tensor::from_floats(std::vector<float>(static_cast<size_t>(E), 0.25f), {E}, DType::kF32);
      const QuantConfig q = fp8_w8a8_moe_quant_config(MoEWeightShape::from(moe), p);
      return MoELayer(model, q, std::move(w), opts);
    };
    MoELayer ep = make(ep_options(b, comm));
    MoELayer ref = make(single_options());
    const int64_t M = tokens_of_rank(R);
    const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, 600 + R);
    const Tensor logits = testing::random_tensor({M, model.num_experts}, DType::kF32, 700 + R);
    expect_close(run_ep(ep, x, logits), ref.forward(x, logits),
                 tolerance(ref.tolerance_name()).rel_l2);
  }
}

// The hook/receiver protocol: a started dispatch completes in the receiver with or without the
// hook, with the synchronous call's results.
TEST(EpAsync, ReceiverWithOrWithoutHookEqualsSync) {
  REQUIRE_RANKS();
  if (gpu_ranks()) GTEST_SKIP() << "the protocol on host tensors (GPU ranks complete at once)";
  const int64_t E = 4 * W, K = 24, topk = 3, M = tokens_of_rank(R);
  PrepareFinalizeAllToAll pf(comm.get(), E);
  PrepareArgs args;
  args.a1 = testing::random_tensor({M, K}, DType::kBF16, 800 + R);
  testing::random_routing(M, topk, static_cast<int>(E), 900 + R, &args.topk_ids,
                          &args.topk_weights);
  args.num_experts = E;
  const PrepareResult sync = pf.prepare(args, {});
  AsyncHandle<PrepareResult> with_hook = pf.prepare_async(args, {});
  with_hook.hook();
  const PrepareResult a = with_hook.receiver();
  const PrepareResult c = pf.prepare_async(args, {}).receiver();
  for (const PrepareResult* r : {&a, &c}) {
    EXPECT_TRUE(testing::bitwise_equal(r->a1q, sync.a1q));
    EXPECT_TRUE(testing::bitwise_equal(r->topk_ids, sync.topk_ids));
    EXPECT_TRUE(testing::bitwise_equal(r->topk_weights, sync.topk_weights));
  }
  // Each received token carries an id of this rank's experts.
  const std::vector<int64_t> ids = sync.topk_ids.to_int_vector();
  for (int64_t m = 0; m < sync.topk_ids.size(0); ++m) {
    bool mine = false;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * topk + j)];
      mine = mine || (e >= 0 && e / 4 == R);
    }
    EXPECT_TRUE(mine) << "row " << m;
  }
}

TEST(EpRefusals, CommunicatorOfAnotherSizeOrNone) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small");
  MoELayerOptions opts = ep_options(kBackends[1], comm);
  opts.parallel =
      ParallelConfig::make(1, 2 * W, R, 0, true, All2AllBackend::kAllGatherReduceScatter);
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { MoELayer(model, MoELayer::random_weights(model, opts, 1), opts); }),
      {"allgather_reducescatter", "communicator is rank", std::to_string(2 * W)}));
  opts = ep_options(kBackends[2], comm);
  opts.communicator = nullptr;
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { MoELayer(model, MoELayer::random_weights(model, opts, 1), opts); }),
      {"needs a communicator of", std::to_string(W)}));
}

}  // namespace
}  // namespace moekit
