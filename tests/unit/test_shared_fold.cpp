// Shared experts folded into the routed experts (MoELayerOptions::fold_shared_experts): the folded
// layer against the separate pass and a float64 recomputation, the chunk layout, every reason a
// layer keeps the separate pass, the explain note, and the elementwise ops behind both paths
// (append_shared_slots, shared_expert_gate, add_inplace with row scales).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/elementwise.h"
#include "moekit/core/error.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/presets.h"
#include "moekit/layer/reference.h"
#include "moekit/oracle/plan.h"
#include "previewed_h200.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::error_of;
using testing::random_tensor;

std::vector<int64_t> all_rows(int64_t M) {
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    rows[static_cast<size_t>(m)] = m;
  return rows;
}

std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();
  return {f.begin(), f.end()};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct FoldCase {
  const char* preset;
  int chunks;  // I_s / I
};

class SharedFold : public ::testing::TestWithParam<FoldCase> {};

// The folded layer (one pass through the experts) and the separate pass agree with each other and
// with the float64 recomputation, for every batch size including M = 0, through forward and
// forward_routed (int32 and int64 ids).
TEST_P(SharedFold, FoldedMatchesTheSeparatePassAndFloat64) {
  const FoldCase c = GetParam();
  const ModelPreset& model = find_preset(c.preset);
  MoELayerOptions options;
  options.max_num_tokens = 48;
  options.shared_experts = SharedExpertsMode::kFolded;
  MoELayerOptions separate_options = options;
  separate_options.shared_experts = SharedExpertsMode::kSeparate;
  const MoELayerWeights w = MoELayer::random_weights(model, options, 21);
  MoELayer folded(model, w, options);
  MoELayer separate(model, w, separate_options);

  ASSERT_EQ(folded.shared_fold_reason(), "");
  EXPECT_EQ(folded.shared_chunks(), c.chunks);
  EXPECT_TRUE(folded.has_shared_experts());
  EXPECT_FALSE(folded.kernel().has_shared_experts()) << "no separate pass inside the kernel";
  EXPECT_FALSE(folded.weights().shared_w13.defined()) << "the shared experts are held once";
  EXPECT_EQ(folded.kernel_weights().w13.size(0), model.num_experts + c.chunks);
  EXPECT_EQ(folded.kernel_weights().w2.size(0), model.num_experts + c.chunks);
  EXPECT_EQ(separate.shared_fold_reason(), "MoELayerOptions::shared_experts is separate");
  // auto without tensor parallelism: one chunk keeps the separate pass; two narrow chunks
  // (I = 128) fold up to 256 tokens.
  ASSERT_LT(model.intermediate_size, kAutoFoldMinWidth);
  MoELayerOptions auto_options = options;
  auto_options.shared_experts = SharedExpertsMode::kAuto;
  const MoELayer automatic(model, w, auto_options);
  EXPECT_EQ(automatic.shared_chunks(), c.chunks >= 2 ? c.chunks : 0)
      << automatic.shared_fold_reason();
  EXPECT_EQ(automatic.shared_fold_max_tokens(), c.chunks >= 2 ? kAutoFoldMaxTokensNarrow : 0);
  EXPECT_EQ(folded.shared_fold_max_tokens(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(separate.shared_chunks(), 0);
  EXPECT_TRUE(separate.kernel().has_shared_experts());
  EXPECT_EQ(folded.expert_weight_bytes(), separate.expert_weight_bytes())
      << "the routed experts' bytes, without the chunks";

  // The chunks read back as the given shared experts, bit for bit.
  const SharedExpertWeights a = folded.shared_reference(), b = separate.shared_reference();
  EXPECT_TRUE(testing::bitwise_equal(a.w13, b.w13));
  EXPECT_TRUE(testing::bitwise_equal(a.w2, b.w2));
  EXPECT_TRUE(testing::bitwise_equal(a.w13, w.shared_w13.to_dtype(DType::kF32)));
  EXPECT_TRUE(testing::bitwise_equal(a.w2, w.shared_w2.to_dtype(DType::kF32)));
  EXPECT_EQ(a.gate.defined(), model.shared_expert_gate);
  // Routed experts are untouched by the fold.
  const ExpertWeights e0 = folded.expert_reference(model.num_experts - 1);
  EXPECT_TRUE(
      testing::bitwise_equal(e0.w13, w.w13.select(model.num_experts - 1).to_dtype(DType::kF32)));
  EXPECT_NE(error_of([&] { (void)folded.expert_reference(model.num_experts); }), "");

  const Tolerance& tol = testing::tolerance("bf16");
  for (int64_t M : {0, 1, 13, 48}) {
    SCOPED_TRACE(M);
    const Tensor x = random_tensor({M, model.hidden_size}, DType::kBF16, 100 + M);
    const Tensor logits = random_tensor({M, model.num_experts}, DType::kF32, 200 + M, -2.0f, 2.0f);
    Tensor yf = testing::poisoned({M, model.hidden_size}, DType::kBF16);
    folded.forward_into(yf, x, logits, {});
    const Tensor ys = separate.forward(x, logits);
    ASSERT_FALSE(testing::has_nan(yf));
    if (M == 0) continue;
    const RoutingResult r = folded.router().select_experts(x, logits);
    const std::vector<double> ref = reference_forward(folded, x, r, all_rows(M));
    EXPECT_EQ(ref, reference_forward(separate, x, r, all_rows(M)));
    const double ef = relative_error(yf, ref, all_rows(M));
    const double es = relative_error(ys, ref, all_rows(M));
    EXPECT_LT(ef, tol.rel_l2);
    EXPECT_LT(es, tol.rel_l2);
    EXPECT_GT(ef, 0.0);
    // Folded vs separate: only the order of the sums and one rounding separate them.
    EXPECT_LT(relative_error(yf, doubles(ys), all_rows(M)), tol.rel_l2);

    // Routing given by the caller (int64 ids converted at the layer edge) gives the same output.
    Tensor ids64 = Tensor::empty(r.topk_ids.shape(), DType::kInt64);
    const std::vector<int64_t> id = r.topk_ids.to_int_vector();
    for (size_t i = 0; i < id.size(); ++i)
      ids64.data_as<int64_t>()[i] = id[i];
    EXPECT_TRUE(testing::bitwise_equal(folded.forward_routed(x, ids64, r.topk_weights), yf));
    EXPECT_TRUE(testing::bitwise_equal(folded.forward_routed(x, r.topk_ids, r.topk_weights), yf));
  }
  // A caller's routing of the wrong width is refused, naming it.
  const Tensor x = random_tensor({3, model.hidden_size}, DType::kBF16, 5);
  Tensor ids, weights;
  testing::random_routing(3, model.top_k + 1, model.num_experts, 6, &ids, &weights);
  EXPECT_TRUE(
      contains(error_of([&] { (void)folded.forward_routed(x, ids, weights); }), "topk_ids"));
}

INSTANTIATE_TEST_SUITE_P(Presets, SharedFold,
                         ::testing::Values(FoldCase{"small-deepseek", 1},
                                           FoldCase{"small-qwen2-moe", 2}),
                         [](const ::testing::TestParamInfo<FoldCase>& info) {
                           return testing::param_name(info.param.preset);
                         });

std::string reason(const ModelPreset& model, const MoELayerOptions& options,
                   const QuantConfig& quant = QuantConfig::unquantized()) {
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  PlanOptions plan_options;
  plan_options.log = false;
  plan_options.preview = true;
  const MoEPlan plan = plan_moe(moe, quant, plan_options);
  return MoELayer::shared_fold_reason_for(model, moe, quant, plan, options.shared_experts);
}

// auto with narrow chunks: forwards of up to kAutoFoldMaxTokensNarrow tokens visit the chunks,
// larger ones run the separate pass (from the shared tensors the layer then also holds); both
// match float64, and the stage marks say which ran.
TEST(SharedFoldHybrid, SlotsUpTo256TokensThenTheSeparatePass) {
  struct Recorder final : StageObserver {
    mutable std::vector<std::string> names;
    void stage_done(std::string_view stage, Stream) const override { names.emplace_back(stage); }
  };
  const ModelPreset& model = find_preset("small-qwen2-moe");
  MoELayerOptions options;
  options.max_num_tokens = 300;
  MoELayer layer(model, MoELayer::random_weights(model, options, 31), options);
  ASSERT_EQ(layer.shared_chunks(), 2);
  ASSERT_EQ(layer.shared_fold_max_tokens(), 256);
  EXPECT_TRUE(layer.weights().shared_w13.defined()) << "held for the separate pass";
  EXPECT_TRUE(layer.kernel().has_shared_experts());
  for (int64_t M : {int64_t{7}, int64_t{256}, int64_t{257}, int64_t{300}}) {
    SCOPED_TRACE(M);
    const Tensor x = random_tensor({M, model.hidden_size}, DType::kBF16, 40 + M);
    const Tensor logits = random_tensor({M, model.num_experts}, DType::kF32, 50 + M, -2.0f, 2.0f);
    Recorder rec;
    Tensor y = testing::poisoned({M, model.hidden_size}, DType::kBF16);
    layer.forward_into(y, x, logits, RunContext{Stream{}, nullptr, &rec});
    const auto count = [&](const char* n) {
      return std::count(rec.names.begin(), rec.names.end(), n);
    };
    EXPECT_EQ(count("shared_slots"), M <= 256 ? 1 : 0);
    EXPECT_EQ(count("shared_experts"), M <= 256 ? 0 : 1);
    ASSERT_FALSE(testing::has_nan(y));
    const RoutingResult r = layer.router().select_experts(x, logits);
    EXPECT_LT(relative_error(y, reference_forward(layer, x, r, all_rows(M)), all_rows(M)),
              testing::tolerance("bf16").rel_l2);
  }
}

// Every reason a layer keeps the separate pass is named; such layers still compute the shared
// experts (checked against float64 where a layer is cheap to build here).
TEST(SharedFoldReasons, EachIsNamed) {
  const ModelPreset ds = find_preset("small-deepseek");
  MoELayerOptions fold;
  fold.shared_experts = SharedExpertsMode::kFolded;
  EXPECT_EQ(reason(ds, fold), "");
  // One narrow chunk keeps the separate pass without tensor parallelism.
  EXPECT_TRUE(contains(reason(ds, {}), "auto: 1 chunk of I=128")) << reason(ds, {});
  // One chunk of I >= kAutoFoldMinWidth keeps the separate pass.
  const std::string wide_one = reason(find_preset("deepseek-v3"), {});
  EXPECT_TRUE(contains(wide_one, "auto: 1 chunk of I=2048")) << wide_one;
  EXPECT_EQ(reason(find_preset("small-qwen2-moe"), {}), "");  // 2 chunks fold (up to 256 tokens)
  MoEConfig narrow = MoELayer::make_moe_config(ds, {}), wide_i = narrow;
  wide_i.intermediate_size = kAutoFoldMinWidth;
  EXPECT_EQ(MoELayer::shared_fold_token_limit(narrow, SharedExpertsMode::kAuto),
            kAutoFoldMaxTokensNarrow);
  EXPECT_EQ(MoELayer::shared_fold_token_limit(narrow, SharedExpertsMode::kFolded),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(MoELayer::shared_fold_token_limit(wide_i, SharedExpertsMode::kAuto),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(reason(find_preset("tiny"), {}), "the model has no shared experts");
  MoELayerOptions off;
  off.shared_experts = SharedExpertsMode::kSeparate;
  EXPECT_EQ(reason(ds, off), "MoELayerOptions::shared_experts is separate");
  SharedExpertsMode parsed = SharedExpertsMode::kAuto;
  EXPECT_TRUE(parse_shared_experts_mode("separate", &parsed));
  EXPECT_EQ(parsed, SharedExpertsMode::kSeparate);
  EXPECT_FALSE(parse_shared_experts_mode("fold", &parsed));
  MoELayerOptions ep = fold;
  ep.parallel = ParallelConfig::make(/*tp=*/2, 1, 0, 0, /*enable_ep=*/true);
  EXPECT_TRUE(contains(reason(ds, ep), "expert parallelism")) << reason(ds, ep);
  MoELayerOptions mono = fold;
  mono.backend = "cpu_monolithic";
  EXPECT_TRUE(contains(reason(ds, mono), "monolithic")) << reason(ds, mono);
  ModelPreset biased = find_preset("small-gpt-oss");
  biased.num_shared_experts = 1;
  biased.shared_intermediate_size = biased.intermediate_size;
  EXPECT_TRUE(contains(reason(biased, fold), "biases")) << reason(biased, fold);
  ModelPreset llama = find_preset("llama4-scout");
  EXPECT_TRUE(contains(reason(llama, fold), "on the input")) << reason(llama, fold);
  ModelPreset odd = ds;
  odd.shared_intermediate_size = ds.intermediate_size * 3 / 2;
  EXPECT_TRUE(contains(reason(odd, fold), "not a multiple of the experts' I=128"))
      << reason(odd, fold);
  ModelPreset wide = ds;
  wide.shared_intermediate_size = 61 * ds.intermediate_size;  // top_k 4 + 61 chunks > 64 slots
  EXPECT_TRUE(contains(reason(wide, fold), "top_k=4 plus 61 shared chunks of I=128 exceed 64"))
      << reason(wide, fold);
  wide.shared_intermediate_size = 60 * ds.intermediate_size;
  EXPECT_EQ(reason(wide, fold), "");

  // A model with shared experts needs their tensors, whichever way they would run.
  MoELayerWeights missing = MoELayer::random_weights(ds, {}, 4);
  missing.shared_w2 = Tensor{};
  EXPECT_TRUE(contains(error_of([&] { (void)MoELayer(ds, missing, {}); }),
                       "shared_w13/shared_w2 were not given"));
  // Forcing the fold where it cannot be is refused with the reason; under auto the same layer
  // runs the separate pass.
  EXPECT_TRUE(contains(error_of<UnsupportedError>([&] {
                         (void)MoELayer(odd, MoELayer::random_weights(odd, fold, 4), fold);
                       }),
                       "cannot fold into the routed experts"));
  // The layers behind two of them: the separate pass, still right.
  MoELayerOptions mono_auto;
  mono_auto.backend = "cpu_monolithic";
  for (const auto& [model, options] :
       {std::pair{odd, MoELayerOptions{}}, std::pair{ds, mono_auto}}) {
    MoELayer layer(model, MoELayer::random_weights(model, options, 4), options);
    EXPECT_NE(layer.shared_fold_reason(), "");
    EXPECT_EQ(layer.shared_chunks(), 0);
    const Tensor x = random_tensor({9, model.hidden_size}, DType::kBF16, 7);
    const Tensor logits = random_tensor({9, model.num_experts}, DType::kF32, 8, -2.0f, 2.0f);
    const Tensor y = layer.forward(x, logits);
    const RoutingResult r = layer.router().select_experts(x, logits);
    EXPECT_LT(relative_error(y, reference_forward(layer, x, r, all_rows(9)), all_rows(9)),
              testing::tolerance("bf16").rel_l2)
        << layer.shared_fold_reason();
  }
}

// What `moekit explain` prints about the shared experts, on a previewed H200.
TEST(SharedFoldReasons, ExplainNote) {
  auto note = [](const char* name, int tp, SharedExpertsMode mode = SharedExpertsMode::kAuto) {
    const ModelPreset& model = find_preset(name);
    testing::PreviewedH200 h200 = testing::previewed_h200();
    h200.layer.parallel = ParallelConfig::make(tp, 1, 0, 0, false);
    const MoEConfig moe = MoELayer::make_moe_config(model, h200.layer);
    const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), h200.plan);
    return MoELayer::shared_experts_note(model, moe, QuantConfig::unquantized(), plan, mode);
  };
  EXPECT_TRUE(contains(note("deepseek-v3", 1), "separate pass (auto: ")) << note("deepseek-v3", 1);
  EXPECT_EQ(note("deepseek-v3", 1, SharedExpertsMode::kFolded),
            "folded into the routed experts: 1 extra expert(s) of I=2048 (experts 256..256) that "
            "every token visits with weight 1");
  // Under TP the routed and the shared experts are both I / tp wide on a rank: deepseek-v3's
  // shared expert stays one chunk, a narrow one at --tp 8: auto folds it up to 256 tokens.
  EXPECT_TRUE(contains(note("deepseek-v3", 8, SharedExpertsMode::kFolded),
                       "1 extra expert(s) of I=256 (experts 256..256)"))
      << note("deepseek-v3", 8, SharedExpertsMode::kFolded);
  EXPECT_TRUE(contains(note("deepseek-v3", 8),
                       "folded into the routed experts: 1 extra expert(s) of I=256 (experts "
                       "256..256) that every token visits with weight 1; forwards of more than "
                       "256 tokens run them as their own pass"))
      << note("deepseek-v3", 8);
  EXPECT_TRUE(contains(note("deepseek-v3", 2), "separate pass (auto: 1 chunk of I=1024"))
      << note("deepseek-v3", 2);
  EXPECT_TRUE(contains(note("qwen1.5-moe-a2.7b", 4), "4 extra expert(s) of I=352 (experts 60..63)"))
      << note("qwen1.5-moe-a2.7b", 4);
  EXPECT_TRUE(contains(note("qwen1.5-moe-a2.7b", 1),
                       "4 extra expert(s) of I=1408 (experts 60..63) that every token visits "
                       "with weight sigmoid(x . shared_gate)"))
      << note("qwen1.5-moe-a2.7b", 1);
  EXPECT_EQ(note("qwen3-30b-a3b", 1), "");
  EXPECT_TRUE(contains(note("llama4-scout", 1), "separate pass (")) << note("llama4-scout", 1);
}

// The elementwise ops on the CPU: values, M = 0 and the refusals (the GPU versions are checked
// against these in tests/gpu).
TEST(SharedFoldOps, AppendSlotsGateAndScaledAdd) {
  const int64_t M = 3, k = 2, H = 40;
  Tensor ids = Tensor::from_ints(std::vector<int64_t>{3, 1, 0, 7, 5, 2}, {M, k}, DType::kInt32);
  Tensor w = Tensor::from_floats(std::vector<float>{0.5f, 0.25f, 1.5f, 2.0f, 0.1f, 0.9f}, {M, k},
                                 DType::kF32);
  const Tensor x = random_tensor({M, H}, DType::kBF16, 3);
  const Tensor g = random_tensor({H}, DType::kF32, 4, -0.5f, 0.5f);
  Tensor out_ids = Tensor::empty({M, k + 2}, DType::kInt32);
  Tensor out_w = Tensor::empty({M, k + 2}, DType::kF32);

  append_shared_slots(ids, w, 8, 2, Tensor{}, Tensor{}, out_ids, out_w, Stream{});
  EXPECT_EQ(out_ids.to_int_vector(), (std::vector<int64_t>{3, 1, 8, 9, 0, 7, 8, 9, 5, 2, 8, 9}));
  EXPECT_EQ(out_w.to_float_vector(),
            (std::vector<float>{0.5f, 0.25f, 1, 1, 1.5f, 2.0f, 1, 1, 0.1f, 0.9f, 1, 1}));

  // With the gate: the shared slots carry sigmoid(x . g), as shared_expert_gate computes it.
  append_shared_slots(ids, w, 8, 2, x, g, out_ids, out_w, Stream{});
  Tensor gate = Tensor::empty({M}, DType::kF32);
  shared_expert_gate(x, g, gate, Stream{});
  const std::vector<double> xv = doubles(x), gv = doubles(g);
  for (int64_t m = 0; m < M; ++m) {
    double dot = 0.0;
    for (int64_t h = 0; h < H; ++h)
      dot += xv[static_cast<size_t>(m * H + h)] * gv[static_cast<size_t>(h)];
    const double want = 1.0 / (1.0 + std::exp(-dot));
    EXPECT_NEAR(gate.data_as<float>()[m], want, 1e-6);
    EXPECT_EQ(out_w.data_as<float>()[m * 4 + 2], gate.data_as<float>()[m]);
    EXPECT_EQ(out_w.data_as<float>()[m * 4 + 3], gate.data_as<float>()[m]);
  }

  // out += row_scale[m] * other[m, :]
  Tensor acc = Tensor::from_floats(std::vector<float>(M * H, 1.0f), {M, H}, DType::kF32);
  const Tensor other = Tensor::from_floats(std::vector<float>(M * H, 2.0f), {M, H}, DType::kF32);
  const Tensor scale = Tensor::from_floats(std::vector<float>{0.5f, -1.0f, 3.0f}, {M}, DType::kF32);
  add_inplace(acc, other, Stream{}, scale);
  EXPECT_EQ(acc.data_as<float>()[0], 2.0f);
  EXPECT_EQ(acc.data_as<float>()[H], -1.0f);
  EXPECT_EQ(acc.data_as<float>()[2 * H + 5], 7.0f);

  // M = 0 writes nothing and does not fail.
  Tensor no_ids = Tensor::empty({0, k}, DType::kInt32), no_w = Tensor::empty({0, k}, DType::kF32);
  Tensor no_oid = Tensor::empty({0, k + 1}, DType::kInt32);
  Tensor no_ow = Tensor::empty({0, k + 1}, DType::kF32);
  EXPECT_NO_THROW(append_shared_slots(no_ids, no_w, 8, 1, Tensor{}, Tensor{}, no_oid, no_ow, {}));

  // Refusals name the tensor.
  Tensor narrow = Tensor::empty({M, k + 1}, DType::kInt32);
  EXPECT_TRUE(contains(
      error_of([&] { append_shared_slots(ids, w, 8, 2, Tensor{}, Tensor{}, narrow, out_w, {}); }),
      "topk_ids with the shared slots"));
  const Tensor short_gate = random_tensor({H - 1}, DType::kF32, 5);
  EXPECT_TRUE(
      contains(error_of([&] { shared_expert_gate(x, short_gate, gate, {}); }), "shared_gate"));
  const Tensor bad_scale = Tensor::from_floats(std::vector<float>{1, 2}, {2}, DType::kF32);
  EXPECT_TRUE(contains(error_of([&] { add_inplace(acc, other, {}, bad_scale); }), "row_scale"));
}

}  // namespace
}  // namespace moekit
