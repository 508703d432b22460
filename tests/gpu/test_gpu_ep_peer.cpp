// Expert parallelism through peer memory (Sm90EpPeerExperts behind the pass-through
// prepare/finalize of the megakernel deployment) with two ranks on one GPU: main forks two
// processes before any CUDA call (what one GPU allows: CUDA IPC between two processes works,
// NCCL refuses two ranks on one device), each runs every test as its rank, and the process
// succeeds only if both ranks pass. The ranks bootstrap through a host-only test communicator in
// shared memory (the peer buffers' IPC handles are all it carries); the tokens travel through
// the GPU buffers. Each rank's output is compared with a single-rank layer holding every expert
// (built on each rank from the same seed: a rank's experts are a slice of it): uneven token
// counts with an idle rank, ids of -1, shared experts, biases, CUDA-graph replay, refusals.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "graph_replay.h"
#include "moekit/comm/communicator.h"
#include "moekit/core/tolerance.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/moe_layer.h"
#include "require_gpu.h"
#include "testing.h"

namespace moekit {
namespace {

constexpr int kWorld = 2;
constexpr int64_t kMaxTokens = 64;

// Host memory shared by the forked ranks (mapped before the fork).
struct Board {
  std::atomic<int> arrived;
  std::atomic<int> generation;
  int64_t slot[kWorld];
};
Board* g_board = nullptr;
int g_rank = -1;  // -1: not forked (test discovery)

// The bootstrap of the forked ranks: all_gather_host and barrier over the shared board; it moves
// no tensors (the experts under test exchange them through GPU memory).
class ForkedCommunicator final : public Communicator {
 public:
  std::string name() const override { return "forked-test"; }
  int rank() const override { return g_rank; }
  int world_size() const override { return kWorld; }
  Device device() const override { return Device::cuda(0); }
  void all_gather(const Tensor&, Tensor&, Stream) override { refuse("all_gather"); }
  void reduce_scatter(const Tensor&, Tensor&, Stream) override { refuse("reduce_scatter"); }
  void all_reduce(Tensor&, Stream) override { refuse("all_reduce"); }
  void all_to_all_v(const Tensor&, const std::vector<int64_t>&, Tensor&,
                    const std::vector<int64_t>&, Stream) override {
    refuse("all_to_all_v");
  }
  std::vector<int64_t> all_gather_host(int64_t value) override {
    g_board->slot[g_rank] = value;
    barrier();
    std::vector<int64_t> out(g_board->slot, g_board->slot + kWorld);
    barrier();
    return out;
  }
  // Sense-reversing: the last to arrive opens the next generation. A rank that never arrives (it
  // failed an assertion the other passed) ends the process rather than hang it.
  void barrier() override {
    const int gen = g_board->generation.load();
    if (g_board->arrived.fetch_add(1) + 1 == kWorld) {
      g_board->arrived.store(0);
      g_board->generation.fetch_add(1);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    while (g_board->generation.load() == gen) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(120)) {
        std::fprintf(stderr, "rank %d: the other rank did not reach the barrier in 120 s\n",
                     g_rank);
        std::_Exit(3);
      }
      sched_yield();
    }
  }

 private:
  [[noreturn]] static void refuse(const char* what) {
    throw Error(fmt::format("ForkedCommunicator (a test bootstrap) moves no tensors: {}", what));
  }
};

std::shared_ptr<Communicator> comm() {
  static auto c = std::make_shared<ForkedCommunicator>();
  return c;
}

#define REQUIRE_RANKS()                                                              \
  REQUIRE_SM90_GPU();                                                                \
  if (g_rank < 0) GTEST_SKIP() << "not forked into ranks (run the binary directly)"; \
  const int R = g_rank;                                                              \
  (void)R

MoELayerOptions single_options() {
  MoELayerOptions o;
  o.device = default_device_info();
  o.max_num_tokens = kMaxTokens;
  o.shared_experts = SharedExpertsMode::kSeparate;
  return o;
}

MoELayerOptions ep_options(std::shared_ptr<Communicator> c, int world, int rank) {
  MoELayerOptions o = single_options();
  o.parallel = ParallelConfig::make(1, world, rank, 0, true, All2AllBackend::kMegakernel);
  o.parallel.use_ep = true;  // also with one rank (make() enables EP across ranks only)
  o.communicator = std::move(c);
  return o;
}

// A forward on the layer's stream, finished before the host reads the output.
void forward(MoELayer& layer, Tensor& out, const Tensor& x, const Tensor& logits) {
  const RunContext ctx{layer.default_stream(), nullptr};
  layer.forward_into(out, x, logits, ctx);
  synchronize(ctx.stream);
}
Tensor forward(MoELayer& layer, const Tensor& x, const Tensor& logits) {
  Tensor out = Tensor::empty({x.size(0), x.size(1)}, x.dtype(), x.device());
  forward(layer, out, x, logits);
  return out;
}

Tensor on_gpu(const Tensor& t) {
  return t.to(Device::cuda(0));
}

// The exchanged layer vs the single-rank one: each rank's partial is rounded to the activation
// dtype before the ranks' partials are summed, so they differ by about one rounding.
void expect_close(const Tensor& out, const Tensor& ref) {
  const Tensor o = out.to(Device::cpu()), r = ref.to(Device::cpu());
  ASSERT_EQ(o.shape(), r.shape());
  EXPECT_FALSE(testing::has_nan(o)) << "unwritten (poisoned) output elements";
  if (r.numel() == 0) return;
  const std::vector<float> f = r.to_float_vector();
  const double err = testing::relative_l2_error(o, std::vector<double>(f.begin(), f.end()));
  std::cout << "[ep_peer] rank " << g_rank << " M=" << o.size(0) << " rel_l2 " << err << "\n";
  EXPECT_LE(err, tolerance("bf16_ep_gpu").rel_l2);
}

// Tokens of rank r at step s: uneven, with an idle rank, then both full.
int64_t tokens_of(int r, int step) {
  static const int64_t t[3][kWorld] = {{5, 0}, {17, 3}, {kMaxTokens, kMaxTokens}};
  return t[step][r];
}

using Launch = Sm90EpPeerExperts::Launch;

Sm90EpPeerExperts& peer_experts(MoELayer& layer) {
  return dynamic_cast<Sm90EpPeerExperts&>(layer.kernel().fused_experts());
}

const char* launch_name(Launch l) {
  return l == Launch::kOne ? "one launch" : l == Launch::kSequence ? "sequence" : "auto";
}

// Both forms of a forward: the sequence of launches and the one persistent launch.
constexpr Launch kForms[] = {Launch::kSequence, Launch::kOne};

TEST(EpPeer, EveryRankMatchesTheSingleRankLayer) {
  REQUIRE_RANKS();
  for (const Launch form : kForms) {
    for (const char* name : {"small", "small-deepseek", "small-gpt-oss"}) {
      SCOPED_TRACE(std::string(name) + ", " + launch_name(form));
      const ModelPreset model = find_preset(name);
      const MoELayerOptions opts = ep_options(comm(), kWorld, R);
      MoELayer ep(model, MoELayer::random_weights(model, opts, 7), opts);
      peer_experts(ep).set_launch(form);
      MoELayer ref(model, MoELayer::random_weights(model, single_options(), 7), single_options());
      EXPECT_EQ(ep.plan().prepare_finalize->name, "passthrough");
      EXPECT_EQ(ep.kernel().fused_experts().name(), "Sm90EpPeerExperts");
      EXPECT_TRUE(ep.kernel().output_is_reduced());
      for (int step = 0; step < 3; ++step) {
        const int64_t M = tokens_of(R, step);
        const Tensor x = on_gpu(
            testing::random_tensor({M, model.hidden_size}, DType::kBF16, 100 + 10 * R + step));
        const Tensor logits =
            on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 200 + R + step));
        Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
        forward(ep, out, x, logits);
        EXPECT_EQ(peer_experts(ep).last_forward_was_one_launch(), form == Launch::kOne);
        expect_close(out, forward(ref, x, logits));
      }
    }
  }
}

// The one launch runs the decode pair's CUDA-core GEMMs and sums like the unpermute: bitwise the
// launch sequence whose local GEMMs are forced onto that row.
TEST(EpPeer, OneLaunchIsBitwiseTheSequenceOnTheCudaCoreRow) {
  REQUIRE_RANKS();
  for (const char* name : {"small", "small-gpt-oss"}) {
    SCOPED_TRACE(name);
    const ModelPreset model = find_preset(name);
    MoELayerOptions opts = ep_options(comm(), kWorld, R);
    MoELayer one(model, MoELayer::random_weights(model, opts, 21), opts);
    peer_experts(one).set_launch(Launch::kOne);
    opts.tile_config = "1x64simt";
    MoELayer seq(model, MoELayer::random_weights(model, opts, 21), opts);
    peer_experts(seq).set_launch(Launch::kSequence);
    for (int step = 0; step < 3; ++step) {
      const int64_t M = tokens_of(R, step);
      const Tensor x =
          on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 500 + 10 * R + step));
      const Tensor logits =
          on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 600 + R + step));
      Tensor a = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
      Tensor b = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
      forward(one, a, x, logits);
      forward(seq, b, x, logits);
      const Tensor ha = a.to(Device::cpu());
      EXPECT_FALSE(testing::has_nan(ha)) << "M=" << M;
      EXPECT_TRUE(testing::bitwise_equal(ha, b.to(Device::cpu()))) << "M=" << M;
    }
  }
}

// Packed W4A16 weights (MXFP4, NVFP4 with its per-expert global scales): the one launch runs the
// W4A16 CUDA-core row's tasks, bitwise the launch sequence whose local GEMMs (Sm90Mxfp4Experts /
// Sm90Nvfp4Experts) are forced onto that row. (random_quantized_layer draws each rank's experts
// from its own stream, so there is no single-rank layer of the same weights to compare with;
// EpPeerOneRank.QuantizedMatchesTheLayerWithoutExchange does that on one rank.)
TEST(EpPeer, QuantizedOneLaunchIsBitwiseTheSequence) {
  REQUIRE_RANKS();
  for (const char* scheme : {"mxfp4_w4a16", "nvfp4_w4a16"}) {
    for (const char* name : {"small", "small-gpt-oss"}) {
      SCOPED_TRACE(std::string(scheme) + " " + name);
      const ModelPreset model = find_preset(name);
      MoELayerOptions opts = ep_options(comm(), kWorld, R);
      MoELayer one = random_quantized_layer(model, scheme, opts, 23);
      peer_experts(one).set_launch(Launch::kOne);
      opts.tile_config = "1x64simt";
      MoELayer seq = random_quantized_layer(model, scheme, opts, 23);
      peer_experts(seq).set_launch(Launch::kSequence);
      EXPECT_EQ(one.kernel().fused_experts().name(), "Sm90EpPeerExperts");
      for (int step = 0; step < 3; ++step) {
        const int64_t M = tokens_of(R, step);
        const Tensor x = on_gpu(
            testing::random_tensor({M, model.hidden_size}, DType::kBF16, 900 + 10 * R + step));
        const Tensor logits =
            on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 950 + R + step));
        Tensor a = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
        Tensor b = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
        forward(one, a, x, logits);
        EXPECT_TRUE(peer_experts(one).last_forward_was_one_launch());
        forward(seq, b, x, logits);
        const Tensor ha = a.to(Device::cpu());
        EXPECT_FALSE(testing::has_nan(ha)) << "M=" << M;
        EXPECT_TRUE(testing::bitwise_equal(ha, b.to(Device::cpu()))) << "M=" << M;
      }
    }
  }
}

// The two forms write the same regions and pass the same barriers: ranks may differ in a forward.
TEST(EpPeer, RanksMayTakeDifferentForms) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small-deepseek");
  const MoELayerOptions opts = ep_options(comm(), kWorld, R);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 13), opts);
  MoELayer ref(model, MoELayer::random_weights(model, single_options(), 13), single_options());
  for (int step = 0; step < 3; ++step) {
    // Rank 0 one launch then the sequence then one launch; rank 1 the other way round.
    peer_experts(ep).set_launch((R + step) % 2 == 0 ? Launch::kOne : Launch::kSequence);
    const int64_t M = tokens_of(R, step);
    const Tensor x =
        on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 700 + 10 * R + step));
    const Tensor logits =
        on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 800 + R + step));
    Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
    forward(ep, out, x, logits);
    expect_close(out, forward(ref, x, logits));
  }
}

// Auto: one launch at a quarter of a row per expert or fewer, the sequence above.
TEST(EpPeer, AutoTakesOneLaunchAtDecodeSizes) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small-deepseek");  // 32 experts, top 4, two ranks
  const MoELayerOptions opts = ep_options(comm(), kWorld, R);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 17), opts);
  peer_experts(ep).set_launch(Launch::kAuto);
  for (const int64_t M : {int64_t{1}, int64_t{2}, kMaxTokens}) {
    const Tensor x = on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 31));
    const Tensor logits = on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 32));
    Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
    forward(ep, out, x, logits);
    EXPECT_EQ(
        peer_experts(ep).last_forward_was_one_launch(),
        Sm90EpPeerExperts::kOneLaunchExpertsPerSlot * kWorld * M * model.top_k <= model.num_experts)
        << "M=" << M;
  }
}

TEST(EpPeer, IdsOfMinusOneContributeNothing) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small");
  const MoELayerOptions opts = ep_options(comm(), kWorld, R);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 11), opts);
  MoELayer ref(model, MoELayer::random_weights(model, single_options(), 11), single_options());
  const int64_t M = 9 + 4 * R;
  Tensor ids, weights;
  testing::random_routing(M, model.top_k, model.num_experts, 300 + R, &ids, &weights);
  testing::drop_some_slots(ids);  // token 0 goes nowhere: its output is zero
  const Tensor x = on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 400 + R));
  Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
  const RunContext ctx{ep.default_stream(), nullptr};
  ep.forward_routed_into(out, x, on_gpu(ids), on_gpu(weights), ctx);
  synchronize(ctx.stream);
  const RunContext ref_ctx{ref.default_stream(), nullptr};
  const Tensor want = ref.forward_routed(x, on_gpu(ids), on_gpu(weights), ref_ctx);
  synchronize(ref_ctx.stream);
  expect_close(out, want);
  const std::vector<float> h = out.to(Device::cpu()).to_float_vector();
  for (int64_t c = 0; c < model.hidden_size; ++c)
    ASSERT_EQ(h[static_cast<size_t>(c)], 0.0f) << "column " << c;
}

TEST(EpPeer, CudaGraphReplayIsBitwiseIdentical) {
  REQUIRE_RANKS();
  for (const Launch form : kForms) {
    SCOPED_TRACE(launch_name(form));
    const ModelPreset model = find_preset("small-deepseek");
    const MoELayerOptions opts = ep_options(comm(), kWorld, R);
    MoELayer ep(model, MoELayer::random_weights(model, opts, 5), opts);
    peer_experts(ep).set_launch(form);
    testing::expect_graph_replay_bitwise(ep, R == 0 ? 33 : 7);
  }
}

TEST(EpPeer, BadInputIsRefusedOnEveryRank) {
  REQUIRE_RANKS();
  const ModelPreset model = find_preset("small");
  const MoELayerOptions opts = ep_options(comm(), kWorld, R);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 3), opts);
  const Tensor x =
      on_gpu(testing::random_tensor({kMaxTokens + 1, model.hidden_size}, DType::kBF16, 1));
  const Tensor logits =
      on_gpu(testing::random_tensor({kMaxTokens + 1, model.num_experts}, DType::kF32, 2));
  const std::string msg = testing::error_of([&] { (void)ep.forward(x, logits); });
  EXPECT_TRUE(testing::contains_all(msg, {"M=65", "max_num_tokens=64"})) << msg;
  // A communicator of the wrong size is refused when the layer is built.
  const MoELayerOptions wrong =
      ep_options(std::make_shared<SingleRankCommunicator>(Device::cuda(0)), kWorld, R);
  const std::string built = testing::error_of(
      [&] { (void)MoELayer(model, MoELayer::random_weights(model, wrong, 3), wrong); });
  EXPECT_TRUE(testing::contains_all(built, {"communicator is rank 0 of 1", "of 2"})) << built;
}

// One rank (no other process): the exchange runs through this rank's own buffer only.
TEST(EpPeerOneRank, MatchesTheLayerWithoutExchange) {
  REQUIRE_SM90_GPU();
  const ModelPreset model = find_preset("small-deepseek");
  const MoELayerOptions opts =
      ep_options(std::make_shared<SingleRankCommunicator>(Device::cuda(0)), 1, 0);
  MoELayer ep(model, MoELayer::random_weights(model, opts, 9), opts);
  MoELayer ref(model, MoELayer::random_weights(model, single_options(), 9), single_options());
  EXPECT_EQ(ep.kernel().fused_experts().name(), "Sm90EpPeerExperts");
  for (const Launch form : kForms) {
    peer_experts(ep).set_launch(form);
    for (const int64_t M : {int64_t{0}, int64_t{1}, int64_t{37}, kMaxTokens}) {
      SCOPED_TRACE(std::string(launch_name(form)) + ", M=" + std::to_string(M));
      const Tensor x = on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 7));
      const Tensor logits = on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 8));
      Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
      forward(ep, out, x, logits);
      expect_close(out, forward(ref, x, logits));
    }
  }
}

// Quantized weights on one rank: each form against the layer without exchange, which
// random_quantized_layer builds with the same weights (the stream of EP rank 0).
TEST(EpPeerOneRank, QuantizedMatchesTheLayerWithoutExchange) {
  REQUIRE_SM90_GPU();
  const ModelPreset model = find_preset("small-gpt-oss");
  for (const char* scheme : {"mxfp4_w4a16", "nvfp4_w4a16", "mxfp4_a8"}) {
    const MoELayerOptions opts =
        ep_options(std::make_shared<SingleRankCommunicator>(Device::cuda(0)), 1, 0);
    MoELayer ep = random_quantized_layer(model, scheme, opts, 29);
    MoELayer ref = random_quantized_layer(model, scheme, single_options(), 29);
    EXPECT_EQ(ep.kernel().fused_experts().name(), "Sm90EpPeerExperts");
    // MXFP4 with fp8 activations: the launch sequence only (one launch refuses, with the reason).
    const bool one_launch = std::string(scheme) != "mxfp4_a8";
    for (const Launch form : {Launch::kSequence, Launch::kOne}) {
      if (form == Launch::kOne && !one_launch) continue;
      peer_experts(ep).set_launch(form);
      for (const int64_t M : {int64_t{0}, int64_t{1}, int64_t{37}, kMaxTokens}) {
        SCOPED_TRACE(std::string(scheme) + ", " + launch_name(form) + ", M=" + std::to_string(M));
        const Tensor x = on_gpu(testing::random_tensor({M, model.hidden_size}, DType::kBF16, 7));
        const Tensor logits =
            on_gpu(testing::random_tensor({M, model.num_experts}, DType::kF32, 8));
        Tensor out = on_gpu(testing::poisoned({M, model.hidden_size}, DType::kBF16));
        forward(ep, out, x, logits);
        EXPECT_EQ(peer_experts(ep).last_forward_was_one_launch(), form == Launch::kOne);
        expect_close(out, forward(ref, x, logits));
      }
    }
    if (!one_launch) {
      peer_experts(ep).set_launch(Launch::kOne);
      const Tensor x = on_gpu(testing::random_tensor({1, model.hidden_size}, DType::kBF16, 7));
      const Tensor logits = on_gpu(testing::random_tensor({1, model.num_experts}, DType::kF32, 8));
      const std::string msg = testing::error_of([&] { (void)forward(ep, x, logits); });
      EXPECT_TRUE(testing::contains_all(msg, {"MOEKIT_EP_PEER_LAUNCH=one", "quantized"})) << msg;
    }
  }
}

}  // namespace
}  // namespace moekit

// Forks the ranks before any CUDA call; rank 1's output goes to a file that the parent prints
// after both have finished. Test discovery (--gtest_list_tests) runs unforked.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  void* shared = mmap(nullptr, sizeof(moekit::Board), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    std::perror("mmap");
    return 2;
  }
  moekit::g_board = new (shared) moekit::Board{};
  const std::string log1 = "/tmp/test_gpu_ep_peer.rank1." + std::to_string(getpid()) + ".log";
  std::vector<pid_t> pids;
  for (int r = 0; r < moekit::kWorld; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      moekit::g_rank = r;
      if (r > 0) {
        if (std::freopen(log1.c_str(), "w", stdout) == nullptr) std::_Exit(2);
        (void)dup2(fileno(stdout), fileno(stderr));
      }
      const int rc = RUN_ALL_TESTS();
      std::fflush(stdout);
      std::_Exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    (void)waitpid(pids[r], &status, 0);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
      std::fprintf(stderr, "rank %zu failed (status %d)\n", r, status);
      failed = 1;
    }
  }
  std::ifstream in(log1);
  std::cout << "---- rank 1 ----\n" << in.rdbuf() << std::flush;
  std::remove(log1.c_str());
  return failed;
}
