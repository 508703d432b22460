#include "moekit/modular/experts.h"

#include <fmt/format.h>
#include <algorithm>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

template <typename T>
bool contains(const std::vector<T>& items, const T& value) {
  return std::find(items.begin(), items.end(), value) != items.end();
}

std::string device_rejection(const ExpertsCapabilities& caps, const DeviceInfo& device) {
  const std::string what = fmt::format("current device {}", device.to_string());
  if (!contains(caps.device_types, device.type)) return what;
  if (device.type == DeviceType::kCUDA) {
    if (device.compute_capability < caps.min_compute_capability ||
        device.compute_capability > caps.max_compute_capability) {
      return fmt::format("{} (needs sm_{}..sm_{})", what, caps.min_compute_capability,
                         caps.max_compute_capability);
    }
    if (device.preview) return {};  // planning for a device that is not here
    if (!built_with_cuda()) return what + " (moekit was built without CUDA)";
    if (!device.present) return what + " (no such GPU is present)";
  }
  return {};
}

bool parallel_ok(const ParallelSupport& p, const ParallelConfig& config) {
  if (p.requires_ep && !config.use_ep) return false;
  // The megakernel deployment passes tokens through to experts that exchange them themselves:
  // only classes that name it serve it, and they serve nothing else.
  if (config.use_megakernel() != contains(p.all2all_backends, All2AllBackend::kMegakernel)) {
    return false;
  }
  if (config.use_ep && !p.expert_parallel) return false;
  if (config.use_all2all_kernels()) {
    if (!p.all2all) return false;
    if (!p.all2all_backends.empty() && !contains(p.all2all_backends, config.all2all_backend)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string_view activation_format_name(ActivationFormat format) {
  return format == ActivationFormat::kStandard ? "standard" : "batched_experts";
}

ExpertTokensMetadata ExpertTokensMetadata::make_from_list(const std::vector<int32_t>& counts,
                                                          Device device) {
  std::vector<int64_t> values(counts.begin(), counts.end());
  Tensor host = Tensor::from_ints(values, {static_cast<int64_t>(counts.size())}, DType::kInt32);
  ExpertTokensMetadata meta;
  meta.expert_num_tokens = device.is_cpu() ? host : host.to(device);
  meta.expert_num_tokens_cpu = counts;
  return meta;
}

std::vector<int64_t> ExpertTokensMetadata::host_counts(int64_t num_experts, int64_t capacity,
                                                       std::string_view who) const {
  std::vector<int64_t> counts;
  if (expert_num_tokens_cpu.has_value()) {
    counts.assign(expert_num_tokens_cpu->begin(), expert_num_tokens_cpu->end());
  } else {
    expect_defined(expert_num_tokens, "expert_num_tokens");
    counts = (expert_num_tokens.device().is_cpu() ? expert_num_tokens
                                                  : expert_num_tokens.to(Device::cpu()))
                 .to_int_vector();
  }
  MOEKIT_CHECK(static_cast<int64_t>(counts.size()) == num_experts,
               "{}: expert_num_tokens has {} entries, expected E_local = {}", who, counts.size(),
               num_experts);
  for (size_t e = 0; e < counts.size(); ++e) {
    MOEKIT_CHECK(counts[e] >= 0 && counts[e] <= capacity,
                 "{}: local expert {} has {} tokens, must be in [0, {}]", who, e, counts[e],
                 capacity);
  }
  return counts;
}

ExpertsClass::ExpertsClass(ExpertsCapabilities caps, Factory make, ShapeCheck shape_check)
    : caps_(std::move(caps)), make_(std::move(make)), shape_check_(std::move(shape_check)) {}

SupportResult ExpertsClass::is_supported_config(const MoEConfig& moe,
                                                const std::optional<QuantKey>& weight_key,
                                                const std::optional<QuantKey>& activation_key,
                                                ActivationFormat activation_format) const {
  auto reject = [](std::string what) {
    return SupportResult{false, "kernel does not support " + std::move(what)};
  };
  if (std::string why = device_rejection(caps_, moe.device); !why.empty()) return reject(why);
  if (!(moe.is_act_and_mul() || caps_.supports_no_act_and_mul)) {
    return reject("no act_and_mul MLP layer");
  }
  if (!contains(caps_.activations, moe.activation)) {
    return reject(fmt::format("{} activation", activation_name(moe.activation)));
  }
  const bool scheme_ok = std::any_of(
      caps_.quant_schemes.begin(), caps_.quant_schemes.end(), [&](const QuantScheme& s) {
        return s.weight == weight_key && s.activation == activation_key;
      });
  if (!scheme_ok) {
    return reject(fmt::format("quantization scheme {}x{}", quant_key_to_string(weight_key),
                              quant_key_to_string(activation_key)));
  }
  if (!parallel_ok(caps_.parallel, moe.parallel)) {
    // The megakernel deployment is a common surprise: say what serves it.
    const bool megakernel = moe.parallel.use_megakernel() &&
                            !contains(caps_.parallel.all2all_backends, All2AllBackend::kMegakernel);
    return reject(fmt::format("parallel config {}{}", moe.parallel.to_string(),
                              megakernel
                                  ? " (the megakernel deployment takes experts that exchange "
                                    "tokens themselves: Sm90EpPeerExperts on Hopper)"
                                  : ""));
  }
  const bool routing_listed = contains(caps_.routing_methods, moe.routing_method);
  if (caps_.monolithic ? !routing_listed : (!caps_.routing_methods.empty() && !routing_listed)) {
    return reject(fmt::format("routing method {}", routing_method_name(moe.routing_method)));
  }
  const DType logits_dtype = moe.router_logits_dtype.value_or(moe.in_dtype);
  const bool logits_listed = contains(caps_.router_logits_dtypes, logits_dtype);
  if (caps_.monolithic ? !logits_listed : (!caps_.router_logits_dtypes.empty() && !logits_listed)) {
    return reject(fmt::format("router logits dtype {}", dtype_name(logits_dtype)));
  }
  std::string shape_why;
  if (caps_.hidden_dim_multiple > 1 && moe.hidden_dim % caps_.hidden_dim_multiple != 0) {
    shape_why = fmt::format("(needs a multiple of {})", caps_.hidden_dim_multiple);
  } else if (shape_check_) {
    shape_why = shape_check_(moe);
  }
  if (!shape_why.empty()) {
    return reject(fmt::format("{} hidden dim is not supported {}", moe.hidden_dim, shape_why));
  }
  if (activation_format != caps_.format) {
    return reject(fmt::format("{} activation format", activation_format_name(activation_format)));
  }
  if (!caps_.in_dtypes.empty() && !contains(caps_.in_dtypes, moe.in_dtype)) {
    return reject(fmt::format("{} activations", dtype_name(moe.in_dtype)));
  }
  if (moe.has_bias && !caps_.supports_bias) return reject("expert biases");
  if (moe.is_lora_enabled && !caps_.supports_lora) return reject("LoRA");
  return {};
}

std::unique_ptr<Experts> ExpertsClass::make(const MoEConfig& moe, const QuantConfig& quant,
                                            std::optional<int64_t> max_num_tokens,
                                            std::optional<int> num_dispatchers) const {
  MOEKIT_CHECK(static_cast<bool>(make_), "experts class {} has no factory", caps_.name);
  return make_(moe, quant, max_num_tokens, num_dispatchers);
}

Experts::Experts(const ExpertsClass& klass, const MoEConfig& moe, const QuantConfig& quant,
                 std::optional<int64_t> max_num_tokens, std::optional<int> num_dispatchers)
    : klass_(klass),
      moe_(moe),
      quant_(quant),
      max_num_tokens_(max_num_tokens),
      num_dispatchers_(num_dispatchers) {
  if (klass.activation_format() == ActivationFormat::kStandard) {
    MOEKIT_CHECK(!max_num_tokens && !num_dispatchers,
                 "{}: max_num_tokens and num_dispatchers should only be set for the BatchedExperts "
                 "activation format",
                 klass.name());
  } else {
    MOEKIT_CHECK(max_num_tokens && num_dispatchers,
                 "{}: max_num_tokens and num_dispatchers must be set for the BatchedExperts "
                 "activation format",
                 klass.name());
  }
}

WorkspaceShapes ExpertsModular::batched_row_workspace_shapes(int64_t local_num_experts, int64_t N,
                                                             int64_t K,
                                                             Activation activation) const {
  MOEKIT_CHECK(max_num_tokens() && num_dispatchers(),
               "{}: the batched format needs max_num_tokens and num_dispatchers", name());
  const int64_t T = *max_num_tokens() * *num_dispatchers();
  const int64_t E = local_num_experts;
  return WorkspaceShapes{
      {E, T, std::max(N, K)}, {E, T, adjust_N_for_activation(N, activation)}, {E, T, K}};
}

ProblemSize ExpertsModular::moe_problem_size(const Tensor& a1, const Tensor& w1, const Tensor& w2,
                                             const Tensor& topk_ids) const {
  expect_dim(w1, "w1", 3);
  expect_dim(w2, "w2", 3);
  expect_dim(topk_ids, "topk_ids", 2);
  ProblemSize p;
  p.E = w1.size(0);
  p.N = w1.size(1);
  p.K = a1.size(-1);
  if (a1.dim() == 2) {
    MOEKIT_CHECK(topk_ids.size(0) == a1.size(0),
                 "topk_ids has {} rows but hidden_states has {} tokens", topk_ids.size(0),
                 a1.size(0));
    p.M = a1.size(0);
  } else {
    expect_dim(a1, "hidden_states", 3);
    MOEKIT_CHECK(a1.size(0) == p.E, "batched hidden_states has {} experts but w1 has {}",
                 a1.size(0), p.E);
    p.M = a1.size(1);
  }
  p.topk = topk_ids.size(1);
  return p;
}

void ExpertsModular::activation(Activation act, Tensor& output, const Tensor& input,
                                RunContext ctx) const {
  apply_moe_activation(act, moe_config().activation_params(), output, input, ctx.stream);
}

}  // namespace moekit
