// The functional form of the C API: vLLM's fused_experts(hidden_states, w1, w2, topk_weights,
// topk_ids, ...) over the caller's tensors. Each problem signature is planned once (the same
// plan_moe a layer makes) and its kernel and workspaces are kept in a registry.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <mutex>

#include "c_api_internal.h"
#include "core/elementwise.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/oracle/plan.h"

namespace moekit::c_api {
namespace {

// One call's tensors and settings, validated.
struct Call {
  Tensor x;             // (M, H)
  Tensor w13;           // (E, N1, H)
  Tensor w2;            // (E, H, I)
  Tensor topk_weights;  // (M, k) f32
  Tensor topk_ids;      // (M, k) int32 / int64
  Tensor output;        // (M, H); undefined for prepare_weights
  Tensor expert_map;    // (global,) int32, optional
  Tensor w13_bias;      // (E, N1), optional
  Tensor w2_bias;       // (E, H), optional
  Activation activation = Activation::kSilu;
  bool on_input = false;
  bool prepared = false;
  int64_t global_num_experts = 0;
  std::string backend;
};

// What a plan depends on.
struct Signature {
  DeviceType device_type = DeviceType::kCPU;
  int device_index = 0;
  DType dtype = DType::kBF16;
  int64_t E = 0, N1 = 0, H = 0, I = 0, k = 0, global = 0;
  Activation activation = Activation::kSilu;
  bool w13_bias = false, w2_bias = false, expert_map = false;
  std::string backend;
  auto operator<=>(const Signature&) const = default;
};

Signature signature_of(const Call& c) {
  Signature s;
  s.device_type = c.x.device().type;
  s.device_index = c.x.device().index;
  s.dtype = c.x.dtype();
  s.E = c.w13.size(0);
  s.N1 = c.w13.size(1);
  s.H = c.w13.size(2);
  s.I = c.w2.size(2);
  s.k = c.topk_ids.size(1);
  s.global = c.global_num_experts;
  s.activation = c.activation;
  s.w13_bias = c.w13_bias.defined();
  s.w2_bias = c.w2_bias.defined();
  s.expert_map = c.expert_map.defined();
  s.backend = c.backend;
  return s;
}

// `with_output`: a forward (output required) rather than prepare_weights.
Call parse_call(const moekit_fused_experts_args* in, bool with_output) {
  MOEKIT_CHECK(in != nullptr, "args is NULL");
  const moekit_fused_experts_args a = read_versioned(in, moekit_fused_experts_args{});
  Call c;
  c.x = borrowed_tensor(a.hidden_states, "hidden_states");
  c.w13 = borrowed_tensor(a.w13, "w13");
  c.w2 = borrowed_tensor(a.w2, "w2");
  c.topk_weights = borrowed_tensor(a.topk_weights, "topk_weights");
  c.topk_ids = borrowed_tensor(a.topk_ids, "topk_ids");
  if (with_output) c.output = borrowed_tensor(a.output, "output");
  c.expert_map = optional_borrowed_tensor(a.expert_map, "expert_map");
  c.w13_bias = optional_borrowed_tensor(a.w13_bias, "w13_bias");
  c.w2_bias = optional_borrowed_tensor(a.w2_bias, "w2_bias");
  const std::string activation = string_or(a.activation, "silu");
  const auto act = parse_activation(activation);
  MOEKIT_CHECK(act.has_value(),
               "activation '{}' is unknown (silu, gelu, gelu_tanh, swigluoai, ...)", activation);
  c.activation = *act;
  c.on_input = a.apply_router_weight_on_input != 0;
  c.prepared = a.weights_prepared != 0;
  c.backend = string_or(a.backend, "auto");

  expect_dim(c.x, "hidden_states", 2);
  expect_dim(c.w13, "w13", 3);
  expect_dim(c.w2, "w2", 3);
  expect_dim(c.topk_ids, "topk_ids", 2);
  const Device device = c.x.device();
  const DType dtype = c.x.dtype();
  const int64_t M = c.x.size(0), H = c.x.size(1);
  const int64_t E = c.w13.size(0), N1 = c.w13.size(1), I = c.w2.size(2), k = c.topk_ids.size(1);
  expect_tensor(c.x, "hidden_states", {M, H}, {DType::kBF16, DType::kF16, DType::kF32}, device);
  expect_tensor(c.w13, "w13", {E, N1, H}, {dtype}, device);
  expect_tensor(c.w2, "w2", {E, H, I}, {dtype}, device);
  const int64_t expected_n1 = is_gated(c.activation) ? 2 * I : I;
  MOEKIT_CHECK(N1 == expected_n1,
               "w13 {} has N1={} rows per expert but activation {} needs {} (I={} from w2 {})",
               c.w13.describe(), N1, activation_name(c.activation), expected_n1, I,
               c.w2.describe());
  expect_tensor(c.topk_weights, "topk_weights", {M, k}, {DType::kF32}, device);
  expect_tensor(c.topk_ids, "topk_ids", {M, k}, {DType::kInt32, DType::kInt64}, device);
  if (with_output) {
    expect_tensor(c.output, "output", {M, H}, {dtype}, device);
    MOEKIT_CHECK(M == 0 || c.output.data() != c.x.data(),
                 "output and hidden_states are the same memory: give a distinct output");
  }
  if (c.w13_bias.defined()) expect_tensor(c.w13_bias, "w13_bias", {E, N1}, {dtype}, device);
  if (c.w2_bias.defined()) expect_tensor(c.w2_bias, "w2_bias", {E, H}, {dtype}, device);
  c.global_num_experts = a.global_num_experts <= 0 ? E : a.global_num_experts;
  MOEKIT_CHECK(c.global_num_experts >= E, "global_num_experts={} < E={} (w13's experts)",
               c.global_num_experts, E);
  if (c.expert_map.defined()) {
    expect_tensor(c.expert_map, "expert_map", {c.global_num_experts}, {DType::kInt32}, device);
  } else {
    MOEKIT_CHECK(c.global_num_experts == E,
                 "global_num_experts={} differs from E={} (w13's experts): give the expert_map",
                 c.global_num_experts, E);
  }
  MOEKIT_CHECK(k <= c.global_num_experts, "top_k={} > num_experts={}", k, c.global_num_experts);
  return c;
}

// The planned kernel of one signature with its workspaces.
struct FunctionalKernel {
  explicit FunctionalKernel(Device device) : workspace(device) {}
  std::mutex mutex;  // held during a call: the workspaces serve one call at a time
  MoEConfig moe;
  MoEPlan plan;
  std::unique_ptr<FusedMoEKernel> kernel;
  const void* bound[4] = {};  // the w13, w2, w13_bias, w2_bias the kernel was built with
  WorkspaceManager workspace;
  int64_t reserved_tokens = 0;
  Tensor ids32;           // (reserved_tokens, k) int32: int64 topk_ids converted
  ExpertWeights scratch;  // standard weights rewritten per call into the plan's layout
};

std::unique_ptr<FunctionalKernel> plan_functional(const Signature& s) {
  ModelPreset model;
  model.name = "fused_experts";
  model.num_experts = static_cast<int>(s.global);
  model.top_k = static_cast<int>(s.k);
  model.hidden_size = s.H;
  model.intermediate_size = s.I;
  model.activation = s.activation;
  model.has_bias = s.w13_bias || s.w2_bias;
  MoELayerOptions options;
  options.dtype = s.dtype;
  options.device = s.device_type == DeviceType::kCPU
                       ? cpu_device_info()
                       : device_from_name(fmt::format("cuda:{}", s.device_index));
  options.backend = s.backend;
  auto f = std::make_unique<FunctionalKernel>(options.device.device());
  f->moe = MoELayer::make_moe_config(model, options);
  f->moe.num_local_experts = static_cast<int>(s.E);
  f->moe.validate();
  PlanOptions plan_options;
  plan_options.log = false;
  f->plan = plan_moe(f->moe, QuantConfig::unquantized(), plan_options);
  f->plan.check();
  MOEKIT_CHECK(!f->plan.experts->is_monolithic(),
               "backend '{}' routes inside its experts (monolithic): fused_experts takes routed "
               "topk_ids; use a layer (moekit_layer_forward) for it",
               f->plan.backend->name);
  return f;
}

// NOTE: the C API's one registry: functional kernels by signature, made on first use and kept for
// the life of the process. It is never destroyed, so no device memory is released after the CUDA
// runtime shuts down at exit.
class FunctionalKernels {
 public:
  static FunctionalKernels& instance() {
    static auto* registry = new FunctionalKernels();
    return *registry;
  }
  FunctionalKernel& get(const Signature& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table_.find(s);
    if (it == table_.end()) it = table_.emplace(s, plan_functional(s)).first;
    return *it->second;
  }

 private:
  std::mutex mutex_;
  std::map<Signature, std::unique_ptr<FunctionalKernel>> table_;
};

// The routed experts as the kernel reads them: the caller's, or (standard weights under a plan
// with another layout) a copy rewritten into that layout.
ExpertWeights kernel_weights(FunctionalKernel& f, const Call& c, Stream stream) {
  ExpertWeights w{c.w13, c.w2, c.w13_bias, c.w2_bias};
  if (c.prepared || !f.plan.weight_layout) return w;
  log::warn_once(fmt::format(
      "fused_experts: backend '{}' reads w13 as '{}': each call rewrites a copy of the standard "
      "weights (slow, and not CUDA-graph capturable); rewrite them once with "
      "moekit_fused_experts_prepare_weights and pass weights_prepared",
      f.plan.backend->name, f.plan.weight_layout->name));
  if (!f.scratch.w13.defined()) {
    f.scratch.w13 = Tensor::empty(c.w13.shape(), c.w13.dtype(), c.w13.device());
    if (c.w13_bias.defined())
      f.scratch.w13_bias = Tensor::empty(c.w13_bias.shape(), c.w13_bias.dtype(), c.w13.device());
  }
  // NOTE: fused_experts is unquantized, and the unquantized layouts rewrite w13 and its bias
  // only (the quantized sm90_mxfp4 layout also rewrites w2: it never reaches this path).
  f.scratch.w2 = c.w2;
  f.scratch.w2_bias = c.w2_bias;
  f.scratch.w13.copy_from_async(c.w13, stream);
  if (c.w13_bias.defined()) f.scratch.w13_bias.copy_from_async(c.w13_bias, stream);
  f.plan.weight_layout->to_kernel(f.scratch, f.moe, stream);
  return f.scratch;
}

// (Re)builds the kernel when the weights differ from the ones it was built with: the biases
// travel in its QuantConfig, and experts may keep launch state per weight (bind_weights).
void bind(FunctionalKernel& f, const ExpertWeights& w) {
  const void* now[4] = {w.w13.data(), w.w2.data(),
                        w.w13_bias.defined() ? w.w13_bias.data() : nullptr,
                        w.w2_bias.defined() ? w.w2_bias.data() : nullptr};
  if (f.kernel && std::equal(now, now + 4, f.bound)) return;
  QuantConfig quant = QuantConfig::unquantized();
  quant.w1.bias = w.w13_bias;
  quant.w2.bias = w.w2_bias;
  f.kernel = make_kernel(f.plan, f.moe, quant);
  f.kernel->fused_experts().bind_weights(w.w13, w.w2);
  std::copy(now, now + 4, f.bound);
}

// Grows the workspaces (and the id buffer) to at least M tokens, by powers of two.
void reserve(FunctionalKernel& f, const Signature& s, int64_t M, Device device) {
  if (M <= f.reserved_tokens) return;
  const int64_t tokens =
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(M < 16 ? 16 : M)));
  f.workspace.set_growth_locked(false);
  f.workspace.reserve(
      f.kernel->workspace_requests(tokens, s.N1, s.H, s.k, s.global, s.E, s.activation, s.dtype));
  f.workspace.set_growth_locked(device.is_cuda());
  f.ids32 = Tensor::empty({tokens, s.k}, DType::kInt32, device);
  f.reserved_tokens = tokens;
}

}  // namespace
}  // namespace moekit::c_api

using namespace moekit;         // NOLINT: the C entry points below are thin wrappers
using namespace moekit::c_api;  // NOLINT

extern "C" {

moekit_status moekit_fused_experts(const moekit_fused_experts_args* args, void* stream) {
  return guarded([&] {
    const Call c = parse_call(args, /*with_output=*/true);
    MOEKIT_CHECK(!c.x.device().is_cuda() || stream != nullptr,
                 "stream is NULL: fused_experts on {} needs the caller's cudaStream_t "
                 "(MOEKIT_STREAM_LEGACY for the legacy default stream)",
                 c.x.device().to_string());
    const Signature s = signature_of(c);
    FunctionalKernel& f = FunctionalKernels::instance().get(s);
    std::lock_guard<std::mutex> lock(f.mutex);
    const Stream st{stream};
    const ExpertWeights w = kernel_weights(f, c, st);
    bind(f, w);
    const int64_t M = c.x.size(0);
    reserve(f, s, M, c.x.device());
    Tensor ids = c.topk_ids;
    if (ids.dtype() == DType::kInt64) {
      ids = f.ids32.slice(0, 0, M);
      convert_ids_to_int32(c.topk_ids, ids, st);
    }
    ModularApplyArgs a;
    a.hidden_states = c.x;
    a.w1 = w.w13;
    a.w2 = w.w2;
    a.topk_weights = c.topk_weights;
    a.topk_ids = ids;
    a.activation = c.activation;
    a.global_num_experts = c.global_num_experts;
    a.expert_map = c.expert_map;
    a.apply_router_weight_on_input = c.on_input;
    a.output = c.output;
    f.kernel->apply(a, RunContext{st, &f.workspace});
  });
}

moekit_status moekit_fused_experts_prepare_weights(const moekit_fused_experts_args* args,
                                                   void* stream, char** layout) {
  return guarded([&] {
    MOEKIT_CHECK(layout != nullptr, "layout (the result pointer) is NULL");
    *layout = nullptr;
    const Call c = parse_call(args, /*with_output=*/false);
    FunctionalKernel& f = FunctionalKernels::instance().get(signature_of(c));
    if (!f.plan.weight_layout) {
      *layout = copy_string("standard");
      return;
    }
    std::lock_guard<std::mutex> lock(f.mutex);
    ExpertWeights w{c.w13, c.w2, c.w13_bias, c.w2_bias};
    f.plan.weight_layout->to_kernel(w, f.moe, Stream{stream});
    synchronize(Stream{stream});
    MOEKIT_CHECK(w.w13.data() == c.w13.data(), "layout '{}' did not rewrite w13 in place",
                 f.plan.weight_layout->name);
    *layout = copy_string(f.plan.weight_layout->name);
  });
}

}  // extern "C"
