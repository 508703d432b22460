// CPU reference experts: one expert MLP per (token, slot) row, fp32 accumulation, intermediates
// rounded where a GPU kernel stores them (see the header).
#include "moekit/experts/cpu_reference.h"
#include "moekit/oracle/backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "modular/batched_layout.h"
#include "modular/cpu_rows.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"

namespace moekit {
namespace {

// ---- the row engine
// ------------------------------------------------------------------------------

inline float to_f(float v) {
  return v;
}
inline float to_f(bf16_t v) {
  return to_float(v);
}
inline float to_f(f16_t v) {
  return to_float(v);
}

// sum_i x[i] * w[i] in fp32, in 8 interleaved partial sums (fixed order: deterministic).
template <typename WT>
float dot(const float* x, const WT* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l)
      acc[l] += x[i + l] * to_f(w[i + l]);
  }
  for (; i < n; ++i)
    acc[i % 8] += x[i] * to_f(w[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Expert weights of one layer, checked: w1 (E, N, K), w2 (E, K, D), biases as floats.
struct ReferenceWeightView {
  const void* w1 = nullptr;
  const void* w2 = nullptr;
  DType w_dtype = DType::kF32;
  std::vector<float> b1;  // (E * N) or empty
  std::vector<float> b2;  // (E * K) or empty
  int64_t E = 0, N = 0, K = 0, D = 0;
  Activation activation = Activation::kSilu;
  ActivationParams params;
  DType act_dtype = DType::kF32;  // rounding of the GEMM1 output and the activation output
};

// One row of work: expert `local` on input row `src` (element offset), result to `dst`.
struct RowJob {
  int64_t local;  // -1: write zeros
  int64_t src;
  int64_t dst;
};

std::vector<float> bias_as_floats(const Tensor& bias, const char* name, int64_t E, int64_t n) {
  if (!bias.defined()) return {};
  MOEKIT_CHECK(bias.device().is_cpu(), "{} must be on the CPU, got {}", name,
               bias.device().to_string());
  MOEKIT_CHECK(bias.numel() == E * n, "{} {} must be ({}, {})", name, bias.describe(), E, n);
  MOEKIT_CHECK(detail::is_cpu_float_dtype(bias.dtype()) || bias.dtype() == DType::kF64,
               "{} dtype {} must be a float type", name, dtype_name(bias.dtype()));
  return bias.to_float_vector();
}

// Checks w1 (E, N, K) and w2 (E, K, D) against the activation; E may be -1 (any).
ReferenceWeightView make_weights(const Tensor& w1, const Tensor& w2, Activation activation,
                                 const ActivationParams& params, const Tensor& b1, const Tensor& b2,
                                 DType act_dtype) {
  expect_defined(w1, "w1");
  expect_defined(w2, "w2");
  expect_dim(w1, "w1", 3);
  expect_dim(w2, "w2", 3);
  for (const Tensor* w : {&w1, &w2}) {
    const char* name = w == &w1 ? "w1" : "w2";
    MOEKIT_CHECK(w->device().is_cpu(), "{} must be on the CPU for the reference experts, got {}",
                 name, w->device().to_string());
    MOEKIT_CHECK(detail::is_cpu_float_dtype(w->dtype()),
                 "{} dtype {} must be bf16, f16 or f32 (unquantized reference experts)", name,
                 dtype_name(w->dtype()));
    expect_contiguous(*w, name);
  }
  MOEKIT_CHECK(w1.dtype() == w2.dtype(), "w1 dtype {} and w2 dtype {} must match",
               dtype_name(w1.dtype()), dtype_name(w2.dtype()));
  ReferenceWeightView w;
  w.w1 = w1.data();
  w.w2 = w2.data();
  w.w_dtype = w1.dtype();
  w.E = w1.size(0);
  w.N = w1.size(1);
  w.K = w1.size(2);
  MOEKIT_CHECK(!is_gated(activation) || w.N % 2 == 0,
               "w1 {} has N = {} rows per expert, which must be even for the gated activation {}",
               w1.describe(), w.N, activation_name(activation));
  w.D = activation_output_dim(activation, w.N);
  expect_shape(w2, "w2", {w.E, w.K, w.D});
  w.b1 = bias_as_floats(b1, "w1_bias", w.E, w.N);
  w.b2 = bias_as_floats(b2, "w2_bias", w.E, w.K);
  w.activation = activation;
  w.params = params;
  w.act_dtype = act_dtype;
  return w;
}

template <typename WT>
void run_rows_typed(const ReferenceWeightView& w, const void* in, DType in_dtype, void* out,
                    DType out_dtype, const std::vector<RowJob>& jobs) {
  const auto* w1 = static_cast<const WT*>(w.w1);
  const auto* w2 = static_cast<const WT*>(w.w2);
  const int64_t num_jobs = static_cast<int64_t>(jobs.size());
  const int64_t N = w.N, K = w.K, D = w.D;
#pragma omp parallel
  {
    std::vector<float> h(static_cast<size_t>(K)), g(static_cast<size_t>(N)),
        a(static_cast<size_t>(D)), y(static_cast<size_t>(K));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_jobs; ++i) {
      const RowJob& job = jobs[static_cast<size_t>(i)];
      if (job.local < 0) {
        std::fill(y.begin(), y.end(), 0.0f);
        detail::store_row(out, out_dtype, job.dst, K, y.data());
        continue;
      }
      const int64_t e = job.local;
      detail::load_row(in, in_dtype, job.src, K, h.data());
      const WT* w1e = w1 + e * N * K;
      for (int64_t n = 0; n < N; ++n) {
        float v = dot(h.data(), w1e + n * K, K);
        if (!w.b1.empty()) v += w.b1[static_cast<size_t>(e * N + n)];
        g[static_cast<size_t>(n)] = v;
      }
      detail::round_row(g.data(), N, w.act_dtype);
      apply_activation_row(w.activation, w.params, g.data(), a.data(), D);
      detail::round_row(a.data(), D, w.act_dtype);
      const WT* w2e = w2 + e * K * D;
      for (int64_t k = 0; k < K; ++k) {
        float v = dot(a.data(), w2e + k * D, D);
        if (!w.b2.empty()) v += w.b2[static_cast<size_t>(e * K + k)];
        y[static_cast<size_t>(k)] = v;
      }
      detail::store_row(out, out_dtype, job.dst, K, y.data());
    }
  }
}

void run_rows(const ReferenceWeightView& w, const void* in, DType in_dtype, void* out,
              DType out_dtype, const std::vector<RowJob>& jobs) {
  switch (w.w_dtype) {
    case DType::kF32:
      return run_rows_typed<float>(w, in, in_dtype, out, out_dtype, jobs);
    case DType::kBF16:
      return run_rows_typed<bf16_t>(w, in, in_dtype, out, out_dtype, jobs);
    case DType::kF16:
      return run_rows_typed<f16_t>(w, in, in_dtype, out, out_dtype, jobs);
    default:
      throw Error(fmt::format("reference experts: weight dtype {} is not bf16/f16/f32",
                              dtype_name(w.w_dtype)));
  }
}

// ---- shared pieces of the two Experts classes
// ----------------------------------------------------

void check_unquantized(const QuantConfig& quant, const char* who) {
  if (quant.is_quantized()) {
    throw UnsupportedError(
        fmt::format("{} supports unquantized weights and activations only; got quantization {}",
                    who, quant.describe()));
  }
}

void check_float_cpu(const Tensor& t, const char* name) {
  expect_defined(t, name);
  MOEKIT_CHECK(t.device().is_cpu(), "{} must be on the CPU for the reference experts, got {}", name,
               t.device().to_string());
  MOEKIT_CHECK(detail::is_cpu_float_dtype(t.dtype()), "{} dtype {} must be bf16, f16 or f32", name,
               dtype_name(t.dtype()));
  expect_contiguous(t, name);
}

ExpertsCapabilities reference_caps(const char* name, ActivationFormat format) {
  ExpertsCapabilities caps;
  caps.name = name;
  caps.format = format;
  caps.monolithic = false;
  caps.device_types = {DeviceType::kCPU};
  caps.supports_no_act_and_mul = true;
  const auto acts = all_activations();
  caps.activations.assign(acts.begin(), acts.end());
  caps.quant_schemes = {QuantScheme{std::nullopt, std::nullopt}};
  caps.parallel = ParallelSupport{};  // EP and all2all, any backend
  caps.in_dtypes = {DType::kBF16, DType::kF16, DType::kF32};
  caps.supports_expert_map = true;
  caps.supports_bias = true;
  caps.supports_lora = false;
  caps.expects_unquantized_inputs = false;
  return caps;
}

}  // namespace

// ---- CpuReferenceExperts
// -------------------------------------------------------------------------

CpuReferenceExperts::CpuReferenceExperts(const MoEConfig& moe, const QuantConfig& quant,
                                         std::optional<int64_t> max_num_tokens,
                                         std::optional<int> num_dispatchers)
    : ExpertsModular(klass(), moe, quant, max_num_tokens, num_dispatchers) {
  check_unquantized(quant, "CpuReferenceExperts");
}

const ExpertsClass& CpuReferenceExperts::klass() {
  static const ExpertsClass k(
      reference_caps("CpuReferenceExperts", ActivationFormat::kStandard),
      [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_num_tokens,
         std::optional<int> num_dispatchers) -> std::unique_ptr<Experts> {
        return std::make_unique<CpuReferenceExperts>(moe, quant, max_num_tokens, num_dispatchers);
      });
  return k;
}

WorkspaceShapes CpuReferenceExperts::workspace_shapes(
    int64_t M, int64_t N, int64_t K, int64_t topk, int64_t global_num_experts,
    int64_t local_num_experts, const ExpertTokensMetadata* expert_tokens_meta,
    Activation activation) const {
  const int64_t rows = M * topk;
  return WorkspaceShapes{
      {rows, std::max(N, K)}, {rows, adjust_N_for_activation(N, activation)}, {M, topk, K}};
}

std::shared_ptr<const TopKWeightAndReduce> CpuReferenceExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceContiguous>();
}

void CpuReferenceExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  check_float_cpu(args.hidden_states, "hidden_states");
  check_float_cpu(args.output, "output");
  expect_dim(args.hidden_states, "hidden_states", 2);
  MOEKIT_CHECK(!args.a1q_scale.defined(),
               "CpuReferenceExperts: a1q_scale is set but the reference experts take unquantized "
               "inputs only");
  const ReferenceWeightView w =
      make_weights(args.w1, args.w2, args.activation, moe_config().activation_params(),
                   quant_config().w1_bias(), quant_config().w2_bias(), args.output.dtype());
  const int64_t M = args.hidden_states.size(0);
  expect_shape(args.hidden_states, "hidden_states", {M, w.K});
  expect_defined(args.topk_ids, "topk_ids");
  expect_shape(args.topk_ids, "topk_ids", {M, kAnyDim});
  const int64_t topk = args.topk_ids.size(1);
  if (args.output.dim() == 3) {
    expect_shape(args.output, "output", {M, topk, w.K});
  } else {
    expect_shape(args.output, "output", {M * topk, w.K});
  }
  if (M == 0) return;

  const std::vector<int64_t> ids = detail::read_topk_ids(args.topk_ids);
  const int64_t global_num_experts = args.global_num_experts > 0 ? args.global_num_experts
                                     : args.expert_map.defined() ? args.expert_map.size(0)
                                                                 : w.E;
  const detail::LocalExpertMap to_local(args.expert_map, /*rank=*/0, w.E);
  std::vector<RowJob> jobs(static_cast<size_t>(M * topk));
  for (int64_t s = 0; s < M * topk; ++s) {
    const int64_t e = ids[static_cast<size_t>(s)];
    const int64_t local = (e >= 0 && e < global_num_experts) ? to_local(e) : -1;
    jobs[static_cast<size_t>(s)] = RowJob{local, (s / topk) * w.K, s * w.K};
  }
  run_rows(w, args.hidden_states.data(), args.hidden_states.dtype(), args.output.data(),
           args.output.dtype(), jobs);
}

// ---- CpuBatchedReferenceExperts
// ------------------------------------------------------------------

CpuBatchedReferenceExperts::CpuBatchedReferenceExperts(const MoEConfig& moe,
                                                       const QuantConfig& quant,
                                                       std::optional<int64_t> max_num_tokens,
                                                       std::optional<int> num_dispatchers)
    : ExpertsModular(klass(), moe, quant, max_num_tokens, num_dispatchers) {
  MOEKIT_CHECK(
      max_num_tokens.has_value() && num_dispatchers.has_value(),
      "CpuBatchedReferenceExperts needs max_num_tokens and num_dispatchers (BatchedExperts "
      "format)");
  MOEKIT_CHECK(*max_num_tokens > 0 && *num_dispatchers > 0,
               "CpuBatchedReferenceExperts: max_num_tokens = {} and num_dispatchers = {} must be "
               "positive",
               *max_num_tokens, *num_dispatchers);
  check_unquantized(quant, "CpuBatchedReferenceExperts");
}

const ExpertsClass& CpuBatchedReferenceExperts::klass() {
  static const ExpertsClass k(
      reference_caps("CpuBatchedReferenceExperts", ActivationFormat::kBatchedExperts),
      [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_num_tokens,
         std::optional<int> num_dispatchers) -> std::unique_ptr<Experts> {
        return std::make_unique<CpuBatchedReferenceExperts>(moe, quant, max_num_tokens,
                                                            num_dispatchers);
      });
  return k;
}

WorkspaceShapes CpuBatchedReferenceExperts::workspace_shapes(int64_t, int64_t N, int64_t K, int64_t,
                                                             int64_t, int64_t local_num_experts,
                                                             const ExpertTokensMetadata*,
                                                             Activation activation) const {
  return batched_row_workspace_shapes(local_num_experts, N, K, activation);
}

std::shared_ptr<const TopKWeightAndReduce>
CpuBatchedReferenceExperts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void CpuBatchedReferenceExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  check_float_cpu(args.hidden_states, "hidden_states");
  check_float_cpu(args.output, "output");
  expect_dim(args.hidden_states, "hidden_states", 3);
  MOEKIT_CHECK(!args.a1q_scale.defined(),
               "CpuBatchedReferenceExperts: a1q_scale is set but the reference experts take "
               "unquantized inputs only");
  const ReferenceWeightView w =
      make_weights(args.w1, args.w2, args.activation, moe_config().activation_params(),
                   quant_config().w1_bias(), quant_config().w2_bias(), args.output.dtype());
  const int64_t E = w.E;
  const int64_t T = args.hidden_states.size(1);
  expect_shape(args.hidden_states, "hidden_states", {E, T, w.K});
  expect_shape(args.output, "output", {E, T, w.K});
  MOEKIT_CHECK(args.expert_tokens_meta != nullptr,
               "CpuBatchedReferenceExperts needs expert_tokens_meta (tokens per local expert)");
  const std::vector<int64_t> counts =
      args.expert_tokens_meta->host_counts(E, T, "CpuBatchedReferenceExperts");
  std::vector<RowJob> jobs;
  jobs.reserve(static_cast<size_t>(E * T));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = counts[static_cast<size_t>(e)];
    for (int64_t r = 0; r < T; ++r) {
      const int64_t offset = (e * T + r) * w.K;
      jobs.push_back(RowJob{r < count ? e : -1, offset, offset});
    }
  }
  run_rows(w, args.hidden_states.data(), args.hidden_states.dtype(), args.output.data(),
           args.output.dtype(), jobs);
}

// ---- CpuReferenceSharedExperts
// -------------------------------------------------------------------

CpuReferenceSharedExperts::CpuReferenceSharedExperts(Tensor w13, Tensor w2, Activation activation,
                                                     ActivationParams params, Tensor b13, Tensor b2)
    : w13_(std::move(w13)),
      w2_(std::move(w2)),
      b13_(std::move(b13)),
      b2_(std::move(b2)),
      activation_(activation),
      params_(params) {
  expect_defined(w13_, "shared w13");
  expect_defined(w2_, "shared w2");
  expect_dim(w13_, "shared w13", 2);
  expect_dim(w2_, "shared w2", 2);
  // Validates the shapes once (as a single expert).
  make_weights(w13_.view({1, w13_.size(0), w13_.size(1)}), w2_.view({1, w2_.size(0), w2_.size(1)}),
               activation_, params_, b13_, b2_, DType::kF32);
}

Tensor CpuReferenceSharedExperts::forward(const Tensor& x, RunContext ctx) {
  check_float_cpu(x, "x");
  expect_dim(x, "x", 2);
  const ReferenceWeightView w = make_weights(w13_.view({1, w13_.size(0), w13_.size(1)}),
                                             w2_.view({1, w2_.size(0), w2_.size(1)}), activation_,
                                             params_, b13_, b2_, x.dtype());
  const int64_t M = x.size(0);
  expect_shape(x, "x", {M, w.K});
  Tensor out = Tensor::empty({M, w.K}, x.dtype());
  std::vector<RowJob> jobs(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    jobs[static_cast<size_t>(m)] = RowJob{0, m * w.K, m * w.K};
  run_rows(w, x.data(), x.dtype(), out.data(), out.dtype(), jobs);
  return out;
}

// ---- backend registrations (the unquantized oracle) -------------------------------------------

MOEKIT_REGISTER_EXPERTS_BACKEND(cpu, [] {
  ExpertsBackend b;
  b.oracle = QuantOracleKind::kUnquantized;
  b.name = "cpu";
  b.aliases = {"reference", "cpu_reference"};
  b.priority = kPriorityCpu;
  b.classes = {&CpuReferenceExperts::klass()};
  b.batched_variant = "cpu_batched";
  b.description = "the CPU reference, standard format";
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(cpu_batched, [] {
  ExpertsBackend b;
  b.oracle = QuantOracleKind::kUnquantized;
  b.name = "cpu_batched";
  b.priority = kPriorityCpu + 10;
  b.classes = {&CpuBatchedReferenceExperts::klass()};
  b.description = "the CPU reference, batched format";
  return b;
}());

}  // namespace moekit
