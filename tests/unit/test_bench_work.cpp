// `moekit bench`'s byte and FLOP accounting (tools/bench_work.h): closed-form sizes of what one
// rank holds under tensor and expert parallelism, and the models a run benches. A regression test
// for TB/s and TFLOP/s overstated by the TP factor (23 TB/s printed for deepseek-v3 --tp 8).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "bench_work.h"
#include "testing.h"

namespace moekit::cli {
namespace {

using testing::error_of;

MoELayerOptions options_for(int tp, int dp, int dp_rank, bool ep) {
  MoELayerOptions o;
  o.dtype = DType::kBF16;
  o.parallel = ParallelConfig::make(tp, dp, dp_rank, 0, ep);
  return o;
}

TEST(BenchWork, TensorParallelShardsTheIntermediateSize) {
  const ModelPreset& ds = find_preset("deepseek-v3");  // E=256 k=8 H=7168 I=2048, 1 shared I=2048
  const LayerShard full = LayerShard::of(ds, options_for(1, 1, 0, false));
  const LayerShard tp8 = LayerShard::of(ds, options_for(8, 1, 0, false));
  EXPECT_EQ(full.intermediate, 2048);
  EXPECT_EQ(tp8.intermediate, 256);
  EXPECT_EQ(tp8.num_local_experts, 256);
  EXPECT_EQ(tp8.hidden, 7168);
  EXPECT_EQ(tp8.bytes_per_element, 2.0);
  // w13 (2I, H) + w2 (H, I) = 3 * I * H elements per expert.
  EXPECT_EQ(tp8.expert_elements(), 3.0 * 256 * 7168);
  EXPECT_EQ(full.expert_elements(), 8 * tp8.expert_elements());

  // One token routed to experts 0..7: 8 experts touched, 8 rows.
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  const LayerWork w8 = layer_work(tp8, ids, 1);
  EXPECT_EQ(w8.experts_touched, 8);
  EXPECT_EQ(w8.routed_rows, 8);
  const double shared = 3.0 * 256 * 7168;  // the rank's slice of the shared expert
  EXPECT_EQ(tp8.shared_intermediate, 256);
  EXPECT_EQ(full.shared_intermediate, 2048);
  EXPECT_EQ(w8.weight_bytes, 2.0 * (8 * 3.0 * 256 * 7168 + shared));
  EXPECT_EQ(w8.flops, 2.0 * (8 * 3.0 * 256 * 7168 + shared));
  const LayerWork w1 = layer_work(full, ids, 1);
  EXPECT_EQ(w1.weight_bytes, 8 * w8.weight_bytes)
      << "routed and shared expert bytes shrink by the TP factor";
  EXPECT_EQ(w1.flops, 8 * w8.flops);
}

TEST(BenchWork, ExpertParallelCountsOnlyLocalExperts) {
  const ModelPreset& tiny = find_preset("tiny");  // E=8 k=2 H=64 I=96, silu, no shared experts
  const LayerShard rank1 = LayerShard::of(tiny, options_for(1, 2, 1, true));
  EXPECT_EQ(rank1.num_local_experts, 4);
  EXPECT_EQ(rank1.first_local_expert, 4);
  EXPECT_EQ(rank1.intermediate, 96) << "EP keeps whole experts";
  EXPECT_EQ(rank1.shared_intermediate, 0);
  // Three tokens: (0, 4), (5, 4), (-1, 7): local rows 4, 5, 4, 7; experts 4, 5, 7 touched.
  const std::vector<int64_t> ids = {0, 4, 5, 4, -1, 7};
  const LayerWork w = layer_work(rank1, ids, 3);
  EXPECT_EQ(w.experts_touched, 3);
  EXPECT_EQ(w.routed_rows, 4);
  const double per_expert = 3.0 * 96 * 64;
  EXPECT_EQ(w.weight_bytes, 2.0 * 3 * per_expert);
  EXPECT_EQ(w.flops, 2.0 * 4 * per_expert);
  // An out-of-range id counts for nothing; no tokens is no work.
  EXPECT_EQ(layer_work(rank1, std::vector<int64_t>{8, 100, -5}, 2).routed_rows, 0);
  const LayerWork none = layer_work(rank1, std::vector<int64_t>{}, 0);
  EXPECT_EQ(none.weight_bytes, 0.0);
  EXPECT_EQ(none.flops, 0.0);
}

TEST(BenchWork, NonGatedAndF32Sizes) {
  ModelPreset p = find_preset("tiny");
  p.activation = Activation::kRelu2NoMul;
  MoELayerOptions o = options_for(2, 1, 0, false);
  o.dtype = DType::kF32;
  const LayerShard s = LayerShard::of(p, o);
  EXPECT_FALSE(s.gated);
  EXPECT_EQ(s.intermediate, 48);
  EXPECT_EQ(s.bytes_per_element, 4.0);
  EXPECT_EQ(s.expert_elements(), 2.0 * 48 * 64);  // w1 (I, H) + w2 (H, I)
  EXPECT_EQ(layer_work(s, std::vector<int64_t>{3, 3}, 1).weight_bytes, 4.0 * 2 * 48 * 64);
}

TEST(BenchWork, QuantizedExpertsCountTheirPackedBytes) {
  const ModelPreset& p = find_preset("tiny");
  LayerShard s = LayerShard::of(p, options_for(1, 1, 0, false));
  // fp8 with 128x128 block scales: one byte per element plus the f32 scales.
  s.quantized_expert_bytes = s.expert_elements() + 4.0 * 3;
  const LayerWork w = layer_work(s, std::vector<int64_t>{1, 2, 2, -1}, 2);
  EXPECT_EQ(w.experts_touched, 2);
  EXPECT_EQ(w.weight_bytes, 2 * (s.expert_elements() + 12.0));
  // FLOPs do not depend on the format.
  EXPECT_EQ(w.flops, 2.0 * s.expert_elements() * 3);
}

TEST(BenchWork, ConfigIsBenchedOnceAndPresetsByName) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moekit_bench_work_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"_name_or_path": "my-moe", "num_local_experts": 8,
      "num_experts_per_tok": 2, "hidden_size": 64, "intermediate_size": 96})";
  const std::vector<std::string> defaults = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
  const std::vector<ModelPreset> from_config =
      bench_models((dir / "config.json").string(), defaults);
  ASSERT_EQ(from_config.size(), 1u);
  EXPECT_EQ(from_config[0].name, "my-moe");
  EXPECT_EQ(from_config[0].hidden_size, 64);
  const std::vector<ModelPreset> presets = bench_models("", defaults);
  ASSERT_EQ(presets.size(), 3u);
  EXPECT_EQ(presets[2].name, "deepseek-v3");
  EXPECT_NE(error_of([&] { bench_models("", {"nope"}); }).find("nope"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// --plain-topk: every model routed like the Triton peer (softmax top-k, renormalized), the rest of
// the shape unchanged.
TEST(BenchWork, PlainTopkRoutesLikeThePeer) {
  const ModelPreset grouped = bench_models("", {"deepseek-v3"})[0];
  EXPECT_EQ(grouped.routing_method(), RoutingMethodType::kDeepSeekV3);
  for (const char* name : {"deepseek-v3", "llama4-scout", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(name);
    const ModelPreset m = bench_models("", {name}, /*plain_topk=*/true)[0];
    const ModelPreset& base = find_preset(name);
    EXPECT_EQ(m.routing_method(), RoutingMethodType::kRenormalizeNaive);  // softmax, top-k, renorm
    EXPECT_TRUE(testing::contains_all(m.summary(), {"softmax", "renormalized"})) << m.summary();
    EXPECT_EQ(m.num_experts, base.num_experts);
    EXPECT_EQ(m.top_k, base.top_k);
    EXPECT_EQ(m.hidden_size, base.hidden_size);
    EXPECT_EQ(m.num_shared_experts, base.num_shared_experts);
  }
}

}  // namespace
}  // namespace moekit::cli
