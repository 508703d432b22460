#include "moekit/layer/moe_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/elementwise.h"
#include "moekit/config/quant_factories.h"
#include "moekit/core/checks.h"
#include "moekit/core/env.h"
#include "moekit/core/logging.h"
#include "moekit/experts/cpu_emulation.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/oracle/for_scheme.h"

namespace moekit {
namespace {

// Seeded uniform values in [-scale, scale), generated where the tensor lives (the same values on
// the CPU and the GPU).
// first_index: where t starts in the tensor of the whole model (a rank's experts are a slice).
Tensor random_on(Device device, const Shape& shape, DType dtype, uint64_t seed, float scale,
                 uint64_t first_index = 0) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_uniform(t, seed, scale, Stream{}, first_index);
  return t;
}

Tensor on_device(Tensor host, Device device) {
  return device.is_cpu() ? host : host.to(device);
}

Tensor to_host(const Tensor& t) {
  return t.device().is_cpu() ? t : t.to(Device::cpu());
}

// A QuantDesc with its tensors on the host (scales are small).
QuantDesc desc_on_host(const QuantDesc& d) {
  QuantDesc h = d;
  for (Tensor* t : {&h.scale, &h.alpha_or_gscale, &h.zp, &h.bias}) {
    if (t->defined()) *t = to_host(*t);
  }
  return h;
}

size_t bytes_of(const Tensor& t) {
  return t.defined() ? t.nbytes() : 0;
}

}  // namespace

std::string tolerance_name_for(const QuantConfig& q, DType dtype) {
  switch (q.w1.dtype) {
    case QuantDType::kNone:
      return std::string(dtype_name(dtype));
    case QuantDType::kFp8E4M3:
    case QuantDType::kFp8E5M2:
      return "fp8_w8a8";
    case QuantDType::kInt8:
      return "int8_w8a8";
    case QuantDType::kInt4:
      return q.a1.dtype == QuantDType::kNone ? "int4_w4a16" : "w4a8";
    case QuantDType::kFp4E2M1:
      return q.w1.shape == GroupShape{1, 16} ? "nvfp4" : "mxfp4";
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      return "mxfp6";
  }
  return "bf16";
}

MoEConfig MoELayer::make_moe_config(const ModelPreset& model, const MoELayerOptions& options) {
  MoEConfig moe;
  moe.num_experts = model.num_experts;
  moe.experts_per_token = model.top_k;
  moe.hidden_dim = model.hidden_size;
  moe.intermediate_size = model.intermediate_size;
  moe.parallel = options.parallel;
  MOEKIT_CHECK(model.num_experts % options.parallel.ep_size == 0,
               "num_experts={} must be divisible by ep_size={}", model.num_experts,
               options.parallel.ep_size);
  moe.num_local_experts = model.num_experts / options.parallel.ep_size;
  moe.num_logical_experts = model.num_experts;
  moe.activation = model.activation;
  moe.device = options.device;
  moe.routing_method = model.routing_method();
  moe.in_dtype = options.dtype;
  moe.router_logits_dtype = DType::kF32;
  moe.hidden_dim_unpadded = model.hidden_size;
  moe.intermediate_size_per_partition_unpadded = model.intermediate_size / options.parallel.tp_size;
  moe.moe_backend = options.backend;
  moe.prepare_finalize = options.prepare_finalize;
  moe.tile_config = options.tile_config;
  moe.batch_invariant = options.batch_invariant || env::get_bool(kBatchInvariantEnvVar, false);
  moe.max_num_tokens = options.max_num_tokens;
  moe.has_bias = model.has_bias;
  moe.swiglu_limit = model.swiglu_limit;
  moe.swiglu_alpha = model.swiglu_alpha;
  moe.swiglu_beta = model.swiglu_beta;
  moe.validate();
  return moe;
}

int64_t MoELayer::shared_width(const ModelPreset& model, const ParallelConfig& parallel) {
  const int64_t Is = model.shared_intermediate_size * model.num_shared_experts;
  MOEKIT_CHECK(Is % parallel.tp_size == 0,
               "model {}: the shared experts' width {} (shared_intermediate_size {} x {}) is not "
               "divisible by tp_size={}",
               model.name, Is, model.shared_intermediate_size, model.num_shared_experts,
               parallel.tp_size);
  return Is / parallel.tp_size;
}

RouterConfig MoELayer::make_router_config(const ModelPreset& model, const Tensor& bias) {
  RouterConfig r;
  r.num_experts = model.num_experts;
  r.top_k = model.top_k;
  r.scoring = model.scoring;
  r.renormalize = model.renormalize;
  r.use_grouped_topk = model.num_expert_group > 0;
  r.num_expert_group = model.num_expert_group;
  r.topk_group = model.topk_group;
  r.routed_scaling_factor = model.routed_scaling_factor;
  r.e_score_correction_bias = bias;
  r.llama4_top1 = model.llama4_top1;
  return r;
}

MoELayerWeights MoELayer::random_weights(const ModelPreset& model, const MoELayerOptions& options,
                                         uint64_t seed, bool routed_experts) {
  const MoEConfig moe = make_moe_config(model, options);
  const int64_t E = moe.num_local_experts;
  const int64_t H = model.hidden_size;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t N = is_gated(model.activation) ? 2 * I : I;
  const Device device = options.device.device();
  // Rank r's experts are experts [r * E, (r + 1) * E) of the single-rank model with this seed.
  const uint64_t rank_seed = seed * 1000003ull;
  const uint64_t first = static_cast<uint64_t>(options.parallel.ep_rank * E);
  MoELayerWeights w;
  // Scaled so that GEMM outputs stay O(1) for O(1) inputs.
  const float s1 = 1.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(I));
  if (routed_experts) {
    w.w13 = random_on(device, {E, N, H}, options.dtype, rank_seed + 1, 2.0f * s1,
                      first * static_cast<uint64_t>(N * H));
    w.w2 = random_on(device, {E, H, I}, options.dtype, rank_seed + 2, 2.0f * s2,
                     first * static_cast<uint64_t>(H * I));
  }
  if (model.has_bias && routed_experts) {
    w.w13_bias = random_on(device, {E, N}, options.dtype, rank_seed + 3, 0.1f,
                           first * static_cast<uint64_t>(N));
    w.w2_bias = random_on(device, {E, H}, options.dtype, rank_seed + 4, 0.1f,
                          first * static_cast<uint64_t>(H));
  }
  if (model.has_e_score_correction_bias) {
    w.e_score_correction_bias =
        random_on(device, {model.num_experts}, DType::kF32, seed + 5, 0.05f);
  }
  if (model.num_shared_experts > 0) {
    const int64_t Is = shared_width(model, options.parallel);
    const int64_t Ns = is_gated(model.activation) ? 2 * Is : Is;
    w.shared_w13 = random_on(device, {Ns, H}, options.dtype, seed + 6, 2.0f * s1);
    w.shared_w2 = random_on(device, {H, Is}, options.dtype, seed + 7,
                            2.0f / std::sqrt(static_cast<float>(Is)));
    if (model.shared_expert_gate) {
      w.shared_gate = random_on(device, {1, H}, options.dtype, seed + 8, 2.0f * s1);
    }
  }
  return w;
}

ExpertWeights MoELayer::random_expert(const ModelPreset& model, const MoELayerOptions& options,
                                      uint64_t seed, int64_t expert) {
  const MoEConfig moe = make_moe_config(model, options);
  MOEKIT_CHECK(expert >= 0 && expert < moe.num_experts, "random_expert: expert {} not in [0, {})",
               expert, moe.num_experts);
  const int64_t H = model.hidden_size;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t N = is_gated(model.activation) ? 2 * I : I;
  const uint64_t base = seed * 1000003ull;
  const uint64_t e = static_cast<uint64_t>(expert);
  const float s1 = 1.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(I));
  auto host = [&](const Shape& shape, uint64_t s, float scale, uint64_t first) {
    return random_on(Device::cpu(), shape, options.dtype, s, scale, first).to_dtype(DType::kF32);
  };
  ExpertWeights w;
  w.w13 = host({N, H}, base + 1, 2.0f * s1, e * static_cast<uint64_t>(N * H));
  w.w2 = host({H, I}, base + 2, 2.0f * s2, e * static_cast<uint64_t>(H * I));
  if (model.has_bias) {
    w.w13_bias = host({N}, base + 3, 0.1f, e * static_cast<uint64_t>(N));
    w.w2_bias = host({H}, base + 4, 0.1f, e * static_cast<uint64_t>(H));
  }
  return w;
}

MoELayer::MoELayer(const ModelPreset& model, MoELayerWeights weights, MoELayerOptions options)
    : MoELayer(model, QuantConfig::unquantized(), std::move(weights), std::move(options)) {}

MoELayer::MoELayer(MoELayer&&) noexcept = default;
MoELayer& MoELayer::operator=(MoELayer&&) noexcept = default;
MoELayer::~MoELayer() = default;

void MoELayer::check_weights() const {
  const Device device = options_.device.device();
  const int64_t E = moe_.num_local_experts;
  const int64_t H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const int64_t N = moe_.is_act_and_mul() ? 2 * I : I;
  const MoELayerWeights& w = weights_;
  if (!quant_.is_quantized()) {
    expect_tensor(w.w13, "w13", {E, N, H}, {options_.dtype}, device);
    expect_tensor(w.w2, "w2", {E, H, I}, {options_.dtype}, device);
  } else {
    // Codes: the packed width depends on the format; the experts check it against the scheme.
    expect_tensor(w.w13, "w13", {E, N, kAnyDim}, {w.w13.dtype()}, device);
    expect_tensor(w.w2, "w2", {E, H, kAnyDim}, {w.w2.dtype()}, device);
    for (const auto& [t, name] : {std::pair{&w.w13, "w13"}, std::pair{&w.w2, "w2"}}) {
      MOEKIT_CHECK(element_size(t->dtype()) == 1,
                   "{} {} must hold one-byte codes for the quantized scheme {}", name,
                   t->describe(), quant_.describe());
    }
  }
  MOEKIT_CHECK(w.w13_bias.defined() == model_.has_bias && w.w2_bias.defined() == model_.has_bias,
               "model {} {} expert biases but w13_bias is {} and w2_bias is {}", model_.name,
               model_.has_bias ? "has" : "has no", w.w13_bias.defined() ? "given" : "absent",
               w.w2_bias.defined() ? "given" : "absent");
  if (model_.has_bias) {
    // Quantized schemes keep f32 biases (the Quark parameters); unquantized ones the dtype's.
    const DType alt = quant_.is_quantized() ? DType::kF32 : options_.dtype;
    expect_tensor(w.w13_bias, "w13_bias", {E, N}, {options_.dtype, alt}, device);
    expect_tensor(w.w2_bias, "w2_bias", {E, H}, {options_.dtype, alt}, device);
  }
  if (w.router_weight.defined()) {
    expect_tensor(w.router_weight, "router_weight", {moe_.num_experts, H}, {DType::kF32},
                  Device::cpu());
  }
  if (w.router_bias.defined()) {
    MOEKIT_CHECK(w.router_weight.defined(),
                 "router_bias is given but router_weight is not: the bias belongs to the gate");
    expect_tensor(w.router_bias, "router_bias", {moe_.num_experts}, {DType::kF32}, Device::cpu());
  }
  if (model_.num_shared_experts > 0) {
    MOEKIT_CHECK(w.shared_w13.defined() && w.shared_w2.defined(),
                 "model {} has {} shared expert(s) but shared_w13/shared_w2 were not given",
                 model_.name, model_.num_shared_experts);
    const int64_t Is = shared_width(model_, moe_.parallel);
    const int64_t Ns = moe_.is_act_and_mul() ? 2 * Is : Is;
    expect_tensor(w.shared_w13, "shared_w13", {Ns, H}, {options_.dtype}, device);
    expect_tensor(w.shared_w2, "shared_w2", {H, Is}, {options_.dtype}, device);
  }
  const bool gated_shared = model_.num_shared_experts > 0 && model_.shared_expert_gate;
  MOEKIT_CHECK(w.shared_gate.defined() == gated_shared,
               "model {} {} a per-token shared-expert gate but shared_gate is {}", model_.name,
               gated_shared ? "has" : "has no", w.shared_gate.defined() ? "given" : "absent");
  if (gated_shared) {
    MOEKIT_CHECK(
        w.shared_gate.numel() == H &&
            (w.shared_gate.dim() == 1 || (w.shared_gate.dim() == 2 && w.shared_gate.size(0) == 1)),
        "shared_gate {} must be (1, {}) or ({},)", w.shared_gate.describe(), H, H);
    expect_dtype(w.shared_gate, "shared_gate", {DType::kF32, options_.dtype});
    expect_device(w.shared_gate, "shared_gate", device);
  }
}

const char* shared_experts_mode_name(SharedExpertsMode mode) {
  switch (mode) {
    case SharedExpertsMode::kAuto:
      return "auto";
    case SharedExpertsMode::kFolded:
      return "folded";
    case SharedExpertsMode::kSeparate:
      return "separate";
  }
  return "?";
}

bool parse_shared_experts_mode(std::string_view name, SharedExpertsMode* mode) {
  for (SharedExpertsMode m :
       {SharedExpertsMode::kAuto, SharedExpertsMode::kFolded, SharedExpertsMode::kSeparate}) {
    if (name == shared_experts_mode_name(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
}

std::string MoELayer::shared_fold_reason_for(const ModelPreset& model, const MoEConfig& moe,
                                             const QuantConfig& quant, const MoEPlan& plan,
                                             SharedExpertsMode mode, bool* impossible) {
  if (impossible != nullptr) *impossible = false;
  if (model.num_shared_experts <= 0) return "the model has no shared experts";
  if (mode == SharedExpertsMode::kSeparate) return "MoELayerOptions::shared_experts is separate";
  const std::string why = fold_obstacle(model, moe, quant, plan);
  if (!why.empty()) {
    if (impossible != nullptr) *impossible = true;
    return why;
  }
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t chunks = shared_width(model, moe.parallel) / I;
  // One chunk folds only as a tensor-parallel rank's narrow slice (the case measured).
  if (mode == SharedExpertsMode::kAuto && chunks < 2 &&
      (I >= kAutoFoldMinWidth || moe.parallel.tp_size == 1)) {
    return fmt::format(
        "auto: {} chunk of I={}; folding pays for two or more chunks or a tensor-parallel "
        "rank's one chunk of I < {} (H200: deepseek-v3's one chunk 0.96x-1.04x the separate "
        "pass, qwen1.5-moe-a2.7b's four 0.98x-1.55x; H100: deepseek-v3 --tp 8's one chunk of "
        "256 1.04x-1.46x)",
        chunks, I, kAutoFoldMinWidth);
  }
  return "";
}

int64_t MoELayer::shared_fold_token_limit(const MoEConfig& moe, SharedExpertsMode mode) {
  // A batch-invariant layer runs its shared experts one way at every batch size: folded and
  // separate sum a token's contributions in different orders.
  if (mode == SharedExpertsMode::kAuto && !moe.batch_invariant &&
      moe.intermediate_size_per_partition() < kAutoFoldMinWidth)
    return kAutoFoldMaxTokensNarrow;
  return std::numeric_limits<int64_t>::max();
}

// What rules folding out, whatever the mode ("" when nothing does).
std::string MoELayer::fold_obstacle(const ModelPreset& model, const MoEConfig& moe,
                                    const QuantConfig& quant, const MoEPlan& plan) {
  if (quant.is_quantized()) {
    return fmt::format("the routed experts are quantized ({}), the shared experts are not",
                       quant.describe());
  }
  if (moe.parallel.use_ep) {
    return "expert parallelism: the routed experts are spread over the ranks, the shared "
           "experts run beside them";
  }
  if (plan.experts == nullptr) return "no experts backend was chosen";
  if (plan.experts->is_monolithic()) {
    return fmt::format("the {} experts are monolithic (they route internally)",
                       plan.experts->name());
  }
  if (model.has_bias) return "the routed experts have biases, the shared experts none";
  if (model.llama4_top1) {
    return "the router weight is applied on the input (llama4 top-1), which takes top_k == 1";
  }
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t Is = shared_width(model, moe.parallel);
  if (Is % I != 0) {
    return fmt::format("the shared width I_s={} is not a multiple of the experts' I={}", Is, I);
  }
  // The combine gathers each token's slots in one block (the GPU unpermute takes up to 64).
  constexpr int64_t kMaxSlots = 64;
  if (model.top_k + Is / I > kMaxSlots) {
    return fmt::format("top_k={} plus {} shared chunks of I={} exceed {} slots per token",
                       model.top_k, Is / I, I, kMaxSlots);
  }
  return "";
}

std::string MoELayer::shared_experts_note(const ModelPreset& model, const MoEConfig& moe,
                                          const QuantConfig& quant, const MoEPlan& plan,
                                          SharedExpertsMode mode) {
  if (model.num_shared_experts <= 0) return "";
  const std::string why = shared_fold_reason_for(model, moe, quant, plan, mode);
  if (!why.empty()) return "separate pass (" + why + ")";
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t c = shared_width(model, moe.parallel) / I;
  const int64_t limit = shared_fold_token_limit(moe, mode);
  return fmt::format(
      "folded into the routed experts: {} extra expert(s) of I={} (experts {}..{}) that every "
      "token visits with weight {}{}",
      c, I, moe.num_local_experts, moe.num_local_experts + c - 1,
      model.shared_expert_gate ? "sigmoid(x . shared_gate)" : "1",
      limit == std::numeric_limits<int64_t>::max()
          ? std::string()
          : fmt::format("; forwards of more than {} tokens run them as their own pass (auto: "
                        "chunks of I < {})",
                        limit, kAutoFoldMinWidth));
}

// The shared experts' width split into c = I_s / I chunks appended as local experts
// [E, E + c) in the standard layout: chunk j has the gate rows [jI, (j + 1)I) and the matching up
// rows of shared_w13, and columns [jI, (j + 1)I) of shared_w2. The activation is elementwise over
// the intermediate columns, so the chunks' outputs sum to the shared MLP's.
void MoELayer::fold_shared_into_routed() {
  const int64_t E = moe_.num_local_experts, H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const bool gated = moe_.is_act_and_mul();
  const int64_t N = gated ? 2 * I : I;
  const int64_t Is = weights_.shared_w2.size(1);
  const int c = static_cast<int>(Is / I);
  const DType dtype = options_.dtype;
  const size_t es = element_size(dtype);
  auto host_contiguous = [](const Tensor& t) {
    const Tensor h = to_host(t);
    return h.is_contiguous() ? h : h.clone();
  };
  const Tensor s13 = host_contiguous(weights_.shared_w13);
  const Tensor s2 = host_contiguous(weights_.shared_w2);
  Tensor c13 = Tensor::empty({c, N, H}, dtype);
  Tensor c2 = Tensor::empty({c, H, I}, dtype);
  const auto* src13 = static_cast<const char*>(s13.data());
  const auto* src2 = static_cast<const char*>(s2.data());
  auto* dst13 = static_cast<char*>(c13.data());
  auto* dst2 = static_cast<char*>(c2.data());
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t r = 0; r < N; ++r) {
      const int64_t from = r < I ? j * I + r : Is + j * I + (r - I);
      std::memcpy(dst13 + (j * N + r) * H * es, src13 + from * H * es, H * es);
    }
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(dst2 + (j * H + h) * I * es, src2 + (h * Is + j * I) * es, I * es);
  }
  const Device device = options_.device.device();
  auto extended = [&](const Tensor& routed, const Tensor& chunks) {
    Shape shape = routed.shape();
    shape[0] = E + c;
    Tensor t = Tensor::empty(shape, dtype, device);
    t.slice(0, 0, E).copy_from(routed);
    t.slice(0, E, E + c).copy_from(chunks);
    return t;
  };
  kernel_weights_.w13 = extended(kernel_weights_.w13, c13);
  kernel_weights_.w2 = extended(kernel_weights_.w2, c2);
  // Above the token limit the separate pass runs from the given tensors: keep them only then.
  if (shared_fold_max_tokens_ == std::numeric_limits<int64_t>::max()) {
    weights_.shared_w13 = weights_.shared_w2 = Tensor{};
  }
  shared_chunks_ = c;
  kernel_moe_.num_experts += c;
  kernel_moe_.num_logical_experts += c;
  kernel_moe_.num_local_experts += c;
  kernel_moe_.experts_per_token += c;
}

MoELayer::MoELayer(const ModelPreset& model, QuantConfig quant, MoELayerWeights weights,
                   MoELayerOptions options, std::optional<MoEPlan> plan)
    : model_(model),
      options_(std::move(options)),
      quant_(std::move(quant)),
      weights_(std::move(weights)) {
  moe_ = make_moe_config(model_, options_);
  const Device device = options_.device.device();
  MOEKIT_CHECK(options_.device.present && !options_.device.preview,
               "cannot build a layer on {}: the device is not present{}",
               options_.device.to_string(),
               options_.device.preview ? " (a preview device is for planning only)" : "");
  MOEKIT_CHECK(!quant_.has_bias() || (!weights_.w13_bias.defined() && !weights_.w2_bias.defined()),
               "expert biases were given both in the weights and in the QuantConfig ({}); give "
               "them once",
               quant_.describe());
  if (quant_.has_bias()) {  // the quantized factories carry the biases: take them over
    weights_.w13_bias = quant_.w1.bias;
    weights_.w2_bias = quant_.w2.bias;
  }
  check_weights();
  const int64_t E = moe_.num_local_experts;
  const int64_t H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const int64_t N = moe_.is_act_and_mul() ? 2 * I : I;

  // This rank owns experts [first, first + E_local); the expert_map sends the others to -1.
  first_local_expert_ = static_cast<int>(moe_.parallel.ep_rank * E);
  if (moe_.parallel.use_ep) {
    std::vector<int64_t> map(static_cast<size_t>(moe_.num_experts), -1);
    for (int64_t e = 0; e < E; ++e)
      map[first_local_expert_ + e] = e;
    expert_map_ = on_device(Tensor::from_ints(map, {moe_.num_experts}, DType::kInt32), device);
  }

  router_ = make_router(make_router_config(model_, weights_.e_score_correction_bias));

  // One decision: the experts, the prepare/finalize and the weight layout.
  if (plan) {
    MOEKIT_CHECK(plan->oracle == oracle_kind_for(quant_),
                 "the given plan is for the {} oracle but the weights' scheme ({}) is served by "
                 "the {} oracle",
                 quant_oracle_kind_name(plan->oracle), quant_.describe(),
                 quant_oracle_kind_name(oracle_kind_for(quant_)));
    plan_ = std::move(*plan);
  } else {
    PlanOptions plan_options;
    plan_options.comm = options_.communicator.get();
    plan_ = plan_moe(moe_, quant_, plan_options);
  }
  plan_.check();

  // The routed experts move out of weights_ and into the kernel's layout, in place.
  kernel_weights_.w13 = std::move(weights_.w13);
  kernel_weights_.w2 = std::move(weights_.w2);
  kernel_weights_.w13_bias = std::move(weights_.w13_bias);
  kernel_weights_.w2_bias = std::move(weights_.w2_bias);
  weights_.w13 = weights_.w2 = weights_.w13_bias = weights_.w2_bias = Tensor{};
  if (device.is_cuda()) stream_ = std::make_unique<CudaStream>(device.index);
  if (weights_.shared_gate.defined()) {
    const Tensor g = to_host(weights_.shared_gate);
    shared_gate_ =
        on_device((g.is_contiguous() ? g : g.clone()).view({H}).to_dtype(DType::kF32), device);
  }
  kernel_moe_ = moe_;
  bool impossible = false;
  shared_fold_reason_ =
      shared_fold_reason_for(model_, moe_, quant_, plan_, options_.shared_experts, &impossible);
  if (impossible && options_.shared_experts == SharedExpertsMode::kFolded) {
    throw UnsupportedError(
        fmt::format("layer of {}: the shared experts cannot fold into the "
                    "routed experts (MoELayerOptions::shared_experts = folded): {}",
                    model_.name, shared_fold_reason_));
  }
  if (shared_fold_reason_.empty()) {
    shared_fold_max_tokens_ = shared_fold_token_limit(moe_, options_.shared_experts);
    fold_shared_into_routed();
    log::debug_once(
        fmt::format("shared experts folded into the routed experts as {} extra "
                    "expert(s)",
                    shared_chunks_));
  }
  if (plan_.weight_layout) {
    log::debug_once(fmt::format("{}: weights rewritten into {}", plan_.backend->name,
                                plan_.weight_layout->name));
    plan_.weight_layout->to_kernel(kernel_weights_, kernel_moe_, default_stream());
  }
  if (model_.has_bias) {
    quant_.w1.bias = kernel_weights_.w13_bias;
    quant_.w2.bias = kernel_weights_.w2_bias;
  }

  std::shared_ptr<SharedExperts> shared;
  // The separate pass: unless folded for every forward (then the shared tensors are released).
  if (model_.num_shared_experts > 0 && weights_.shared_w13.defined()) {
    if (device.is_cuda()) {
      shared = std::make_shared<Sm90SharedExperts>(weights_.shared_w13, weights_.shared_w2,
                                                   model_.activation, moe_.activation_params(),
                                                   options_.max_num_tokens);
    } else {
      shared = std::make_shared<CpuReferenceSharedExperts>(
          weights_.shared_w13, weights_.shared_w2, model_.activation, moe_.activation_params());
    }
  }
  // Monolithic kernels take no shared experts (the seed's rule): the layer runs them beside the
  // kernel instead, with the same shared experts and the same add as the modular path.
  if (plan_.experts->is_monolithic()) std::swap(shared, shared_beside_kernel_);
  kernel_ = make_kernel(plan_, kernel_moe_, quant_, shared, options_.communicator.get());
  kernel_->fused_experts().bind_weights(kernel_weights_.w13, kernel_weights_.w2);

  if (options_.workspace == nullptr) workspace_ = std::make_unique<WorkspaceManager>(device);
  WorkspaceManager& ws = workspace();
  MOEKIT_CHECK(ws.device() == device, "the workspace manager is on {} but the layer on {}",
               ws.device().to_string(), device.to_string());
  workspace_requests_ = kernel_->workspace_requests(
      options_.max_num_tokens, N, H, kernel_moe_.experts_per_token, kernel_moe_.num_experts,
      kernel_moe_.num_local_experts, moe_.activation, options_.dtype);
  if (shared_beside_kernel_) {
    for (WorkspaceRequest& r : shared_beside_kernel_->workspace_requests(options_.max_num_tokens))
      workspace_requests_.push_back(std::move(r));
  }
  const bool locked = ws.growth_locked();
  ws.set_growth_locked(false);
  ws.reserve(workspace_requests_);
  ws.set_growth_locked(locked || device.is_cuda());
  routing_ids_ = Tensor::empty({options_.max_num_tokens, model_.top_k}, DType::kInt32, device);
  routing_weights_ = Tensor::empty({options_.max_num_tokens, model_.top_k}, DType::kF32, device);
  if (shared_chunks_ > 0) {
    const Shape folded{options_.max_num_tokens, kernel_moe_.experts_per_token};
    folded_ids_ = Tensor::empty(folded, DType::kInt32, device);
    folded_weights_ = Tensor::empty(folded, DType::kF32, device);
  }
  if (shared_gate_.defined() && weights_.shared_w13.defined()) {  // the separate pass runs
    gate_values_ = Tensor::empty({options_.max_num_tokens}, DType::kF32, device);
  }
}

std::string MoELayer::scheme() const {
  if (!quant_.is_quantized()) return fmt::format("unquantized ({})", dtype_name(options_.dtype));
  const auto [wk, ak] = quant_keys_of(quant_);
  return fmt::format("{} ({} x {})", quant_.describe(), quant_key_to_string(wk),
                     quant_key_to_string(ak));
}

std::string MoELayer::tolerance_name() const {
  return tolerance_name_for(quant_, options_.dtype);
}

size_t MoELayer::expert_weight_bytes() const {
  size_t total = 0;
  for (const Tensor* t : {&kernel_weights_.w13, &kernel_weights_.w2, &kernel_weights_.w13_bias,
                          &kernel_weights_.w2_bias}) {
    // Folded shared experts are the last shared_chunks_ experts: not routed experts.
    const int64_t E = t->defined() ? t->size(0) : 0;
    total += E == 0 ? 0 : bytes_of(*t) / E * (E - shared_chunks_);
  }
  for (const QuantDesc* d : {&quant_.w1, &quant_.w2}) {
    total += bytes_of(d->scale) + bytes_of(d->alpha_or_gscale) + bytes_of(d->zp);
  }
  return total;
}

ExpertWeights MoELayer::expert_reference(int64_t e) const {
  MOEKIT_CHECK(e >= 0 && e < moe_.num_local_experts,
               "expert_reference: local expert {} is outside [0, {})", e, moe_.num_local_experts);
  auto one = [e](const Tensor& t) {
    return t.defined() ? to_host(t.slice(0, e, e + 1)).clone() : Tensor{};
  };
  ExpertWeights w{one(kernel_weights_.w13), one(kernel_weights_.w2), one(kernel_weights_.w13_bias),
                  one(kernel_weights_.w2_bias)};
  if (plan_.weight_layout) plan_.weight_layout->to_standard(w, moe_);
  const int64_t H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const int64_t N = moe_.is_act_and_mul() ? 2 * I : I;
  ExpertWeights out;
  if (quant_.is_quantized()) {
    const QuantDesc w1 = desc_on_host(quant_.w1), w2 = desc_on_host(quant_.w2);
    const QuantDesc a1 = desc_on_host(quant_.a1), a2 = desc_on_host(quant_.a2);
    out.w13 = Tensor::from_floats(dequantize_expert_weight(w.w13.select(0), w1, a1, e, H), {N, H},
                                  DType::kF32);
    out.w2 = Tensor::from_floats(dequantize_expert_weight(w.w2.select(0), w2, a2, e, I), {H, I},
                                 DType::kF32);
  } else {
    out.w13 = w.w13.select(0).to_dtype(DType::kF32);
    out.w2 = w.w2.select(0).to_dtype(DType::kF32);
  }
  if (w.w13_bias.defined()) out.w13_bias = w.w13_bias.select(0).to_dtype(DType::kF32);
  if (w.w2_bias.defined()) out.w2_bias = w.w2_bias.select(0).to_dtype(DType::kF32);
  return out;
}

SharedExpertWeights MoELayer::shared_reference() const {
  MOEKIT_CHECK(has_shared_experts(), "layer of {} has no shared experts", model_.name);
  SharedExpertWeights out;
  if (shared_gate_.defined()) out.gate = to_host(shared_gate_).clone();
  if (weights_.shared_w13.defined()) {
    out.w13 = to_host(weights_.shared_w13).to_dtype(DType::kF32);
    out.w2 = to_host(weights_.shared_w2).to_dtype(DType::kF32);
    return out;
  }
  // Reassembled from the chunks (fold_shared_into_routed), read back in the standard layout.
  const int64_t E = moe_.num_local_experts, H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const int64_t N = moe_.is_act_and_mul() ? 2 * I : I;
  const int64_t c = shared_chunks_, Is = c * I;
  out.w13 = Tensor::empty({N / I * Is, H}, DType::kF32);
  out.w2 = Tensor::empty({H, Is}, DType::kF32);
  float* w13 = out.w13.data_as<float>();
  float* w2 = out.w2.data_as<float>();
  for (int64_t j = 0; j < c; ++j) {
    auto one = [&](const Tensor& t) { return to_host(t.slice(0, E + j, E + j + 1)).clone(); };
    ExpertWeights w{one(kernel_weights_.w13), one(kernel_weights_.w2), Tensor{}, Tensor{}};
    if (plan_.weight_layout) plan_.weight_layout->to_standard(w, kernel_moe_);
    const std::vector<float> v13 = w.w13.to_float_vector(), v2 = w.w2.to_float_vector();
    for (int64_t r = 0; r < N; ++r) {
      const int64_t to = r < I ? j * I + r : Is + j * I + (r - I);
      std::copy_n(v13.begin() + r * H, H, w13 + to * H);
    }
    for (int64_t h = 0; h < H; ++h)
      std::copy_n(v2.begin() + h * I, I, w2 + h * Is + j * I);
  }
  return out;
}

Tensor MoELayer::router_logits(const Tensor& x) const {
  const Tensor& wr = weights_.router_weight;
  MOEKIT_CHECK(wr.defined(),
               "layer of {}: no router (gate) weight was given to compute logits with",
               model_.name);
  expect_shape(x, "x", {kAnyDim, moe_.hidden_dim});
  expect_device(x, "x", Device::cpu());
  const int64_t M = x.size(0), H = x.size(1), E = wr.size(0);
  const std::vector<float> xv = x.to_float_vector();
  const float* w = wr.data_as<const float>();
  const float* b =
      weights_.router_bias.defined() ? weights_.router_bias.data_as<const float>() : nullptr;
  std::vector<float> out(static_cast<size_t>(M * E));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t e = 0; e < E; ++e) {
      double s = b != nullptr ? b[e] : 0.0;
      for (int64_t h = 0; h < H; ++h)
        s += static_cast<double>(xv[m * H + h]) * w[e * H + h];
      out[m * E + e] = static_cast<float>(s);
    }
  }
  return Tensor::from_floats(out, {M, E}, DType::kF32);
}

RunContext MoELayer::complete(RunContext ctx) const {
  if (ctx.workspace == nullptr)
    ctx.workspace = options_.workspace ? options_.workspace : workspace_.get();
  if (ctx.stream.handle == nullptr && stream_) ctx.stream = stream_->get();
  return ctx;
}

Tensor MoELayer::forward(const Tensor& hidden_states, const Tensor& router_logits, RunContext ctx) {
  expect_dim(hidden_states, "hidden_states", 2);
  Tensor output =
      Tensor::empty(hidden_states.shape(), hidden_states.dtype(), hidden_states.device());
  ctx = complete(ctx);
  forward_into(output, hidden_states, router_logits, ctx);
  if (stream_ && ctx.stream.handle == stream_->get().handle) synchronize(ctx.stream);
  return output;
}

void MoELayer::check_hidden_states(const Tensor& hidden_states) const {
  expect_shape(hidden_states, "hidden_states", {kAnyDim, moe_.hidden_dim});
  expect_dtype(hidden_states, "hidden_states", {options_.dtype});
  expect_device(hidden_states, "hidden_states", options_.device.device());
  MOEKIT_CHECK(hidden_states.size(0) <= options_.max_num_tokens,
               "hidden_states has M={} tokens but the layer was built for max_num_tokens={}",
               hidden_states.size(0), options_.max_num_tokens);
}

void MoELayer::add_shared_output(Tensor& output, const Tensor& shared_output,
                                 const Tensor& hidden_states, RunContext ctx) const {
  // With EP inside one data-parallel group every rank sees the same tokens and the ranks' outputs
  // are summed (all-reduce): the (unsharded) shared experts are added on rank 0 only.
  const bool add_shared =
      !(moe_.parallel.use_ep && moe_.parallel.dp_size == 1) || moe_.parallel.ep_rank == 0;
  if (shared_output.defined() && add_shared) {
    Tensor gate;
    if (shared_gate_.defined()) {
      gate = gate_values_.slice(0, 0, output.size(0));
      shared_expert_gate(hidden_states, shared_gate_, gate, ctx.stream);
    }
    add_inplace(output, shared_output, ctx.stream, gate);
    ctx.stage_done("shared_add");
  }
}

void MoELayer::forward_into(Tensor& output, const Tensor& hidden_states,
                            const Tensor& router_logits, RunContext ctx) {
  ctx = complete(ctx);
  expect_dim(hidden_states, "hidden_states", 2);
  const int64_t M = hidden_states.size(0);
  expect_shape(router_logits, "router_logits", {M, moe_.num_experts});
  MOEKIT_CHECK(M <= options_.max_num_tokens,
               "hidden_states has M={} tokens but the layer was built for max_num_tokens={}", M,
               options_.max_num_tokens);
  if (kernel_->is_monolithic()) {
    forward_monolithic_into(output, hidden_states, router_logits, ctx);
    return;
  }
  if (shared_chunks_ > 0 && M <= shared_fold_max_tokens_ && !shared_gate_.defined()) {
    // Folded ungated shared experts: the router's launch writes their slots too.
    check_hidden_states(hidden_states);
    const Tensor weights = folded_weights_.slice(0, 0, M);
    const Tensor ids = folded_ids_.slice(0, 0, M);
    router_->select_experts_with_extra_into(hidden_states, router_logits, weights, ids,
                                            {static_cast<int>(moe_.num_experts), shared_chunks_},
                                            ctx);
    ctx.stage_done("router");
    apply_routed(output, hidden_states, ids, weights, /*slots_routed=*/true, ctx);
    return;
  }
  const Tensor weights = routing_weights_.slice(0, 0, M);
  const Tensor ids = routing_ids_.slice(0, 0, M);
  router_->select_experts_into(hidden_states, router_logits, weights, ids, ctx);
  ctx.stage_done("router");
  forward_routed_into(output, hidden_states, ids, weights, ctx);
}

Tensor MoELayer::forward_routed(const Tensor& hidden_states, const Tensor& topk_ids,
                                const Tensor& topk_weights, RunContext ctx) {
  expect_dim(hidden_states, "hidden_states", 2);
  Tensor output =
      Tensor::empty(hidden_states.shape(), hidden_states.dtype(), hidden_states.device());
  ctx = complete(ctx);
  forward_routed_into(output, hidden_states, topk_ids, topk_weights, ctx);
  if (stream_ && ctx.stream.handle == stream_->get().handle) synchronize(ctx.stream);
  return output;
}

void MoELayer::forward_routed_into(Tensor& output, const Tensor& hidden_states,
                                   const Tensor& topk_ids, const Tensor& topk_weights,
                                   RunContext ctx) {
  ctx = complete(ctx);
  MOEKIT_CHECK(!kernel_->is_monolithic(),
               "the {} experts route internally (backend '{}' is monolithic): forward_routed "
               "cannot take topk_ids/topk_weights; use forward() with the router logits",
               kernel_->fused_experts().name(), plan_.backend->name);
  check_hidden_states(hidden_states);
  const int64_t M = hidden_states.size(0);
  Tensor ids = topk_ids;
  if (topk_ids.defined() && topk_ids.dtype() == DType::kInt64) {
    expect_shape(topk_ids, "topk_ids", {M, model_.top_k});
    ids = routing_ids_.slice(0, 0, M);
    if (ids.data() != topk_ids.data()) convert_ids_to_int32(topk_ids, ids, ctx.stream);
  }
  apply_routed(output, hidden_states, ids, topk_weights, /*slots_routed=*/false, ctx);
}

void MoELayer::apply_routed(Tensor& output, const Tensor& hidden_states, const Tensor& ids,
                            const Tensor& topk_weights, bool slots_routed, RunContext ctx) {
  const int64_t M = hidden_states.size(0);
  ModularApplyArgs args;
  args.hidden_states = hidden_states;
  args.w1 = kernel_weights_.w13;
  args.w2 = kernel_weights_.w2;
  args.topk_weights = topk_weights;
  args.topk_ids = ids;
  args.activation = moe_.activation;
  args.global_num_experts = moe_.num_experts;
  args.expert_map = expert_map_;
  args.apply_router_weight_on_input = router_->apply_router_weight_on_input();
  args.output = output;
  if (shared_chunks_ > 0) args.global_num_experts = kernel_moe_.num_experts;
  if (slots_routed) {  // the routing already holds the shared slots (forward_into)
    args.skip_shared_experts = true;
  } else if (shared_chunks_ > 0 && M <= shared_fold_max_tokens_) {  // every token visits them
    args.skip_shared_experts = true;  // (the kernel's separate pass, held for larger forwards)
    expect_shape(ids, "topk_ids", {M, model_.top_k});
    args.topk_ids = folded_ids_.slice(0, 0, M);
    args.topk_weights = folded_weights_.slice(0, 0, M);
    append_shared_slots(ids, topk_weights, static_cast<int>(moe_.num_experts), shared_chunks_,
                        hidden_states, shared_gate_, args.topk_ids, args.topk_weights, ctx.stream);
    ctx.stage_done("shared_slots");
  }
  MoEOutput out = kernel_->apply(args, ctx);
  add_shared_output(output, out.shared_output, hidden_states, ctx);
}

void MoELayer::forward_monolithic_into(Tensor& output, const Tensor& hidden_states,
                                       const Tensor& router_logits, RunContext ctx) {
  check_hidden_states(hidden_states);
  const int64_t M = hidden_states.size(0);
  expect_shape(output, "output", {M, moe_.hidden_dim});
  expect_dtype(output, "output", {options_.dtype});
  // The routing the layer's own router would run: grouping, bias and scaling go to the kernel.
  const RouterConfig& r = router_->config();
  MonolithicApplyArgs args;
  args.hidden_states = hidden_states;
  args.w1 = kernel_weights_.w13;
  args.w2 = kernel_weights_.w2;
  args.router_logits = router_logits;
  args.activation = moe_.activation;
  args.global_num_experts = moe_.num_experts;
  args.expert_map = expert_map_;
  args.apply_router_weight_on_input = router_->apply_router_weight_on_input();
  if (r.use_grouped_topk) {
    args.num_expert_group = r.num_expert_group;
    args.topk_group = r.topk_group;
  }
  args.e_score_correction_bias = r.e_score_correction_bias;
  args.routed_scaling_factor = r.routed_scaling_factor;
  const Tensor routed = kernel_->apply_monolithic(args, ctx);
  if (routed.data() != output.data()) output.copy_from_async(routed, ctx.stream);
  // Shared experts beside the kernel, after it (the order of the modular synchronous finalize).
  if (shared_beside_kernel_ != nullptr) {
    const Tensor shared = shared_beside_kernel_->forward(hidden_states, ctx);
    ctx.stage_done("shared_experts");
    add_shared_output(output, shared, hidden_states, ctx);
  }
}

}  // namespace moekit
