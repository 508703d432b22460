// CPU emulation experts of the quantized schemes (see the header for the numerics).
#include "moekit/experts/cpu_emulation.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "modular/batched_layout.h"
#include "modular/cpu_rows.h"
#include "moekit/config/quant_factories.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/quant/moe_input_quant.h"
#include "moekit/quant/quantize.h"

namespace moekit {
namespace {

namespace qk = quant_keys;

// sum_i x[i] * w[i] in fp32, 8 interleaved partial sums (the reference experts' order).
float dot(const float* x, const float* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l)
      acc[l] += x[i + l] * w[i + l];
  }
  for (; i < n; ++i)
    acc[i % 8] += x[i] * w[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

bool is_sub_byte(QuantDType d) {
  return d == QuantDType::kFp4E2M1 || d == QuantDType::kInt4 || d == QuantDType::kFp6E3M2 ||
         d == QuantDType::kFp6E2M3;
}

bool activations_quantized(const QuantConfig& q) {
  return q.a1.dtype != QuantDType::kNone;
}

// The weight scheme a descriptor describes, for quant::dequantize.
quant::QuantScheme weight_scheme(const QuantDesc& d) {
  const GroupShape& s = d.shape;
  const bool f32_scales = !d.scale.defined() || d.scale.dtype() != DType::kUE8M0;
  switch (d.dtype) {
    case QuantDType::kFp8E4M3:
    case QuantDType::kFp8E5M2: {
      quant::QuantScheme scheme;
      if (s.is_per_tensor()) {
        scheme = quant::QuantScheme::fp8_per_tensor();
      } else if (s.is_per_channel()) {
        scheme = quant::QuantScheme::fp8_per_channel();
      } else if (s == GroupShape{1, 32} && !f32_scales) {
        scheme = quant::QuantScheme::mx(d.dtype);
      } else if (s.row > 0 && s.col > 0) {
        scheme = quant::QuantScheme::fp8_block(s.row, s.col,
                                               f32_scales ? ScaleDType::kF32 : ScaleDType::kUE8M0);
      } else {
        throw UnsupportedError(
            fmt::format("fp8 weights with scale shape {} are not supported", s.to_string()));
      }
      scheme.dtype = d.dtype;
      return scheme;
    }
    case QuantDType::kInt8:
    case QuantDType::kInt4: {
      const int64_t group = s.is_per_channel() || s.is_per_tensor() ? -1 : s.col;
      quant::QuantScheme scheme =
          quant::QuantScheme::int_weight_groups(d.dtype, group, !d.zp.defined());
      if (s.is_per_tensor()) scheme.block = quant::BlockShape::per_tensor();
      return scheme;
    }
    case QuantDType::kFp4E2M1:
      return s == GroupShape{1, 16} ? quant::QuantScheme::nvfp4() : quant::QuantScheme::mxfp4();
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      return quant::QuantScheme::mx(d.dtype);
    case QuantDType::kNone:
      break;
  }
  throw UnsupportedError("the weight descriptor is not quantized");
}

// One expert's slice of a per-expert tensor (E, ...) as a contiguous CPU tensor.
Tensor expert_slice(const Tensor& t, int64_t e, std::string_view name) {
  MOEKIT_CHECK(t.device().is_cpu(), "{} {} must be on the CPU for the emulation experts", name,
               t.describe());
  MOEKIT_CHECK(e < t.size(0), "{} {} has no expert {}", name, t.describe(), e);
  Tensor s = t.select(e);
  return s.is_contiguous() ? s : s.clone();
}

// The weight's NVFP4 global dequantization scale weight_scale_2 of expert e.
float nvfp4_weight_scale2(const QuantDesc& w, const QuantDesc& a, int64_t e) {
  expect_defined(w.alpha_or_gscale, "nvfp4 g-alphas");
  const std::vector<float> alphas = w.alpha_or_gscale.to_float_vector();
  MOEKIT_CHECK(e < static_cast<int64_t>(alphas.size()), "nvfp4 g-alphas {} has no expert {}",
               w.alpha_or_gscale.describe(), e);
  float s2 = alphas[static_cast<size_t>(e)];
  if (a.dtype != QuantDType::kNone) {
    const std::vector<float> g = a.alpha_or_gscale.to_float_vector();
    MOEKIT_CHECK(!g.empty(), "nvfp4 activation global scale is missing");
    s2 *= g.size() == 1 ? g[0] : g[static_cast<size_t>(e)];
  }
  return s2;
}

std::optional<float> nvfp4_act_gscale(const QuantDesc& a, int64_t e) {
  if (a.dtype != QuantDType::kFp4E2M1 || !(a.shape == GroupShape{1, 16})) return std::nullopt;
  if (!a.alpha_or_gscale.defined() || a.alpha_or_gscale.numel() <= 1) return std::nullopt;
  return a.alpha_or_gscale.to_float_vector()[static_cast<size_t>(e)];
}

bool per_expert_act_gscale(const QuantDesc& a) {
  return a.dtype == QuantDType::kFp4E2M1 && a.shape == GroupShape{1, 16} &&
         a.alpha_or_gscale.defined() && a.alpha_or_gscale.numel() > 1;
}

struct RowJob {
  int64_t local;  // -1: zeros
  int64_t token;
  int64_t dst;
};

ActivationParams activation_params_of(const MoEConfig& moe, const QuantConfig& q) {
  ActivationParams p = moe.activation_params();
  if (q.gemm1_alpha) p.alpha = *q.gemm1_alpha;
  if (q.gemm1_beta) p.beta = *q.gemm1_beta;
  if (q.gemm1_clamp_limit) p.clamp_limit = q.gemm1_clamp_limit;
  return p;
}

std::vector<float> bias_floats(const Tensor& b, const char* name, int64_t E, int64_t n) {
  if (!b.defined()) return {};
  MOEKIT_CHECK(b.device().is_cpu(), "{} {} must be on the CPU", name, b.describe());
  MOEKIT_CHECK(b.numel() == E * n, "{} {} must be ({}, {})", name, b.describe(), E, n);
  return b.to_float_vector();
}

ExpertsCapabilities emulation_caps(const char* name, std::vector<QuantScheme> schemes,
                                   bool deferred,
                                   ActivationFormat format = ActivationFormat::kStandard) {
  ExpertsCapabilities caps;
  caps.name = name;
  caps.format = format;
  caps.monolithic = false;
  caps.device_types = {DeviceType::kCPU};
  caps.supports_no_act_and_mul = true;
  const auto acts = all_activations();
  caps.activations.assign(acts.begin(), acts.end());
  caps.quant_schemes = std::move(schemes);
  caps.parallel = ParallelSupport{};
  caps.in_dtypes = {DType::kBF16, DType::kF16, DType::kF32};
  caps.supports_expert_map = true;
  caps.supports_bias = true;
  caps.supports_lora = false;
  caps.expects_unquantized_inputs = deferred;
  return caps;
}

template <typename T>
ExpertsClass::Factory factory_of() {
  return [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> mnt,
            std::optional<int> nd) -> std::unique_ptr<Experts> {
    return std::make_unique<T>(moe, quant, mnt, nd);
  };
}

}  // namespace

// ---- weight dequantization ----------------------------------------------------------------------

std::vector<float> dequantize_expert_weight(const Tensor& w, const QuantDesc& desc,
                                            const QuantDesc& a_desc, int64_t e, int64_t cols) {
  expect_defined(w, "weight");
  MOEKIT_CHECK(w.dim() == 2 || w.dim() == 3,
               "weight {} must be (E, rows, Kc) codes or one expert's (rows, Kc)", w.describe());
  MOEKIT_CHECK(w.device().is_cpu(), "weight {} must be on the CPU for the emulation experts",
               w.describe());
  MOEKIT_CHECK(element_size(w.dtype()) == 1, "quantized weight {} must hold one-byte codes",
               w.describe());
  const int64_t rows = w.size(w.dim() - 2);
  quant::QuantizedTensor q;
  q.scheme = weight_scheme(desc);
  q.rows = rows;
  q.cols = cols;
  const int64_t row_bytes = quant::code_row_bytes(desc.dtype, cols);
  const Tensor codes =
      w.dim() == 2 ? (w.is_contiguous() ? w : w.clone()) : expert_slice(w, e, "weight");
  const auto* src = codes.data_as<const uint8_t>();
  q.codes.resize(static_cast<size_t>(rows * row_bytes));
  const int64_t code_cols = w.size(w.dim() - 1);
  if (code_cols == row_bytes) {
    std::memcpy(q.codes.data(), src, q.codes.size());
  } else if (is_sub_byte(desc.dtype) && code_cols == cols) {
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const uint8_t> in(src + r * cols, static_cast<size_t>(cols));
      const std::span<uint8_t> out(q.codes.data() + r * row_bytes, static_cast<size_t>(row_bytes));
      if (desc.dtype == QuantDType::kFp6E3M2 || desc.dtype == QuantDType::kFp6E2M3) {
        quant::pack_6bit(in, out);
      } else {
        quant::pack_4bit(in, out);
      }
    }
  } else {
    throw Error(fmt::format("weight {} must be (E, {}, {}) {} codes (packed){}", w.describe(), rows,
                            row_bytes, quant_dtype_name(desc.dtype),
                            is_sub_byte(desc.dtype)
                                ? fmt::format(" or (E, {}, {}) one code per byte", rows, cols)
                                : std::string()));
  }

  const quant::BlockShape& b = q.scheme.block;
  q.scale_rows = b.rows == -1 ? 1 : (rows + b.rows - 1) / b.rows;
  q.scale_cols = b.cols == -1 ? 1 : (cols + b.cols - 1) / b.cols;
  const int64_t num_scales = q.scale_rows * q.scale_cols;
  expect_defined(desc.scale, "weight scale");
  const Tensor scale = expert_slice(desc.scale, e, "weight scale");
  MOEKIT_CHECK(scale.numel() == num_scales,
               "weight scale {} holds {} values per expert, the {} weight of ({}, {}) needs {}",
               desc.scale.describe(), scale.numel(), q.scheme.to_string(), rows, cols, num_scales);
  if (q.scheme.scale_dtype == ScaleDType::kF32) {
    q.scales = scale.to_float_vector();
  } else {
    MOEKIT_CHECK(element_size(scale.dtype()) == 1, "weight scale {} must hold one-byte codes",
                 desc.scale.describe());
    q.scale_codes.assign(scale.data_as<const uint8_t>(),
                         scale.data_as<const uint8_t>() + num_scales);
    if (q.scheme.scale_dtype == ScaleDType::kUE4M3) {
      q.global_scale = 1.0f / nvfp4_weight_scale2(desc, a_desc, e);
    }
  }
  if (!q.scheme.symmetric) {
    const Tensor zp = expert_slice(desc.zp, e, "weight zero points");
    MOEKIT_CHECK(zp.numel() == num_scales, "weight zero points {} must match the scales ({})",
                 desc.zp.describe(), num_scales);
    q.zero_points.assign(zp.data_as<const uint8_t>(), zp.data_as<const uint8_t>() + num_scales);
  }
  return quant::dequantize(q);
}

// ---- the engine ---------------------------------------------------------------------------------

CpuEmulationExperts::CpuEmulationExperts(const ExpertsClass& klass, const MoEConfig& moe,
                                         const QuantConfig& quant,
                                         std::optional<int64_t> max_num_tokens,
                                         std::optional<int> num_dispatchers)
    : ExpertsModular(klass, moe, quant, max_num_tokens, num_dispatchers) {
  const auto [wk, ak] = quant_keys_of(quant);
  const auto& schemes = klass.caps().quant_schemes;
  const bool ok = std::any_of(schemes.begin(), schemes.end(), [&](const QuantScheme& s) {
    return s.weight == wk && s.activation == ak;
  });
  if (!ok) {
    throw UnsupportedError(fmt::format("{}: kernel does not support quantization scheme {}x{}",
                                       klass.name(), quant_key_to_string(wk),
                                       quant_key_to_string(ak)));
  }
}

ProblemSize CpuEmulationExperts::moe_problem_size(const Tensor& a1, const Tensor& w1,
                                                  const Tensor& w2, const Tensor& topk_ids) const {
  expect_dim(a1, "hidden_states", 2);
  expect_dim(w1, "w1", 3);
  expect_dim(w2, "w2", 3);
  expect_dim(topk_ids, "topk_ids", 2);
  MOEKIT_CHECK(topk_ids.size(0) == a1.size(0),
               "topk_ids has {} rows but hidden_states has {} tokens", topk_ids.size(0),
               a1.size(0));
  return ProblemSize{w1.size(0), a1.size(0), w1.size(1), w2.size(1), topk_ids.size(1)};
}

WorkspaceShapes CpuEmulationExperts::workspace_shapes(
    int64_t M, int64_t N, int64_t K, int64_t topk, int64_t global_num_experts,
    int64_t local_num_experts, const ExpertTokensMetadata* expert_tokens_meta,
    Activation activation) const {
  const int64_t rows = M * topk;
  return WorkspaceShapes{
      {rows, std::max(N, K)}, {rows, adjust_N_for_activation(N, activation)}, {M, topk, K}};
}

std::shared_ptr<const TopKWeightAndReduce> CpuEmulationExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceContiguous>();
}

void CpuEmulationExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  const QuantConfig& qc = quant_config();
  expect_defined(args.hidden_states, "hidden_states");
  expect_dim(args.hidden_states, "hidden_states", 2);
  expect_defined(args.output, "output");
  MOEKIT_CHECK(args.hidden_states.device().is_cpu() && args.output.device().is_cpu(),
               "{} runs on the CPU; hidden_states is on {}", name(),
               args.hidden_states.device().to_string());
  MOEKIT_CHECK(detail::is_cpu_float_dtype(args.output.dtype()),
               "{}: output dtype {} must be bf16, f16 or f32", name(),
               dtype_name(args.output.dtype()));
  expect_contiguous(args.output, "output");
  expect_dim(args.w1, "w1", 3);
  expect_dim(args.w2, "w2", 3);
  const int64_t E = args.w1.size(0), N = args.w1.size(1), K = args.w2.size(1);
  MOEKIT_CHECK(!is_gated(args.activation) || N % 2 == 0,
               "w1 {} has N = {} rows per expert, which must be even for the gated activation {}",
               args.w1.describe(), N, activation_name(args.activation));
  const int64_t D = activation_output_dim(args.activation, N);
  MOEKIT_CHECK(args.w2.size(0) == E, "w2 {} must have {} experts like w1 {}", args.w2.describe(), E,
               args.w1.describe());
  const int64_t M = args.hidden_states.size(0);
  expect_defined(args.topk_ids, "topk_ids");
  expect_shape(args.topk_ids, "topk_ids", {M, kAnyDim});
  const int64_t topk = args.topk_ids.size(1);
  if (args.output.dim() == 3) {
    expect_shape(args.output, "output", {M, topk, K});
  } else {
    expect_shape(args.output, "output", {M * topk, K});
  }
  if (M == 0) return;
  const DType act_dtype = args.output.dtype();

  // 1. GEMM1 inputs.
  std::vector<float> A;  // (M, K), unless per-expert quantization is needed
  const bool deferred = expects_unquantized_inputs();
  const bool per_expert_a1 = deferred && per_expert_act_gscale(qc.a1);
  if (!activations_quantized(qc) || deferred) {
    MOEKIT_CHECK(!args.a1q_scale.defined(),
                 "{}: a1q_scale is set but this class takes unquantized inputs", name());
    expect_dtype(args.hidden_states, "hidden_states", {DType::kBF16, DType::kF16, DType::kF32});
    expect_shape(args.hidden_states, "hidden_states", {M, K});
    A = dequantize_moe_input({args.hidden_states, Tensor{}}, QuantDesc{}, K);
    if (deferred && !per_expert_a1) quant_dequant_rows(A, M, K, qc.a1);
  } else {
    const Tensor scale = args.a1q_scale.defined() ? args.a1q_scale : qc.a1.scale;
    MOEKIT_CHECK(scale.defined(),
                 "{}: quantized hidden_states {} need a1q_scale (the prepare step quantizes "
                 "them)",
                 name(), args.hidden_states.describe());
    A = dequantize_moe_input({args.hidden_states, scale}, qc.a1, K);
  }

  // Jobs and the experts they use.
  const std::vector<int64_t> ids = detail::read_topk_ids(args.topk_ids);
  const int64_t global_num_experts = args.global_num_experts > 0 ? args.global_num_experts
                                     : args.expert_map.defined() ? args.expert_map.size(0)
                                                                 : E;
  const detail::LocalExpertMap to_local(args.expert_map, /*rank=*/0, E);
  const int64_t J = M * topk;
  std::vector<RowJob> jobs(static_cast<size_t>(J));
  std::vector<char> used(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < J; ++s) {
    const int64_t g = ids[static_cast<size_t>(s)];
    const int64_t local = (g >= 0 && g < global_num_experts) ? to_local(g) : -1;
    jobs[static_cast<size_t>(s)] = RowJob{local, s / topk, s * K};
    if (local >= 0) used[static_cast<size_t>(local)] = 1;
  }

  // Dequantized weights of the experts in use.
  std::vector<std::vector<float>> W1(static_cast<size_t>(E)), W2(static_cast<size_t>(E));
  std::vector<int64_t> used_list;
  for (int64_t e = 0; e < E; ++e)
    if (used[static_cast<size_t>(e)]) used_list.push_back(e);
  const int64_t num_used = static_cast<int64_t>(used_list.size());
  // NOTE: errors inside the parallel region are collected and rethrown after it.
  std::vector<std::string> errors(static_cast<size_t>(num_used));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < num_used; ++i) {
    const int64_t e = used_list[static_cast<size_t>(i)];
    try {
      W1[static_cast<size_t>(e)] = dequantize_expert_weight(args.w1, qc.w1, qc.a1, e, K);
      W2[static_cast<size_t>(e)] = dequantize_expert_weight(args.w2, qc.w2, qc.a2, e, D);
    } catch (const std::exception& ex) {
      errors[static_cast<size_t>(i)] = ex.what();
    }
  }
  for (const std::string& err : errors) {
    if (!err.empty()) throw Error(fmt::format("{}: {}", name(), err));
  }
  const std::vector<float> b1 = bias_floats(qc.w1_bias(), "w1_bias", E, N);
  const std::vector<float> b2 = bias_floats(qc.w2_bias(), "w2_bias", E, K);
  const ActivationParams params = activation_params_of(moe_config(), qc);

  // 2.-3. GEMM1 and the activation, per (token, expert) row.
  std::vector<float> inter(static_cast<size_t>(J * D), 0.0f);
#pragma omp parallel
  {
    std::vector<float> h(static_cast<size_t>(K)), g(static_cast<size_t>(N));
#pragma omp for schedule(dynamic, 4)
    for (int64_t j = 0; j < J; ++j) {
      const RowJob& job = jobs[static_cast<size_t>(j)];
      if (job.local < 0) continue;
      const int64_t e = job.local;
      std::copy_n(A.data() + job.token * K, K, h.data());
      if (per_expert_a1) quant_dequant_rows(h, 1, K, qc.a1, nvfp4_act_gscale(qc.a1, e));
      const float* w1e = W1[static_cast<size_t>(e)].data();
      for (int64_t n = 0; n < N; ++n) {
        float v = dot(h.data(), w1e + n * K, K);
        if (!b1.empty()) v += b1[static_cast<size_t>(e * N + n)];
        g[static_cast<size_t>(n)] = v;
      }
      detail::round_row(g.data(), N, act_dtype);
      float* a = inter.data() + j * D;
      apply_activation_row(args.activation, params, g.data(), a, D);
      detail::round_row(a, D, act_dtype);
    }
  }

  // 4. Re-quantization of the intermediate.
  if (qc.a2.dtype != QuantDType::kNone) {
    if (per_expert_act_gscale(qc.a2)) {
      for (int64_t j = 0; j < J; ++j) {
        const RowJob& job = jobs[static_cast<size_t>(j)];
        if (job.local < 0) continue;
        quant_dequant_rows(std::span<float>(inter.data() + j * D, static_cast<size_t>(D)), 1, D,
                           qc.a2, nvfp4_act_gscale(qc.a2, job.local));
      }
    } else {
      std::vector<int64_t> valid;
      for (int64_t j = 0; j < J; ++j)
        if (jobs[static_cast<size_t>(j)].local >= 0) valid.push_back(j);
      std::vector<float> compact(valid.size() * static_cast<size_t>(D));
      for (size_t v = 0; v < valid.size(); ++v)
        std::copy_n(inter.data() + valid[v] * D, D, compact.data() + v * D);
      quant_dequant_rows(compact, static_cast<int64_t>(valid.size()), D, qc.a2);
      for (size_t v = 0; v < valid.size(); ++v)
        std::copy_n(compact.data() + v * D, D, inter.data() + valid[v] * D);
    }
  }

  // 5. GEMM2.
#pragma omp parallel
  {
    std::vector<float> y(static_cast<size_t>(K));
#pragma omp for schedule(dynamic, 4)
    for (int64_t j = 0; j < J; ++j) {
      const RowJob& job = jobs[static_cast<size_t>(j)];
      if (job.local < 0) {
        std::fill(y.begin(), y.end(), 0.0f);
      } else {
        const int64_t e = job.local;
        const float* w2e = W2[static_cast<size_t>(e)].data();
        const float* a = inter.data() + j * D;
        for (int64_t k = 0; k < K; ++k) {
          float v = dot(a, w2e + k * D, D);
          if (!b2.empty()) v += b2[static_cast<size_t>(e * K + k)];
          y[static_cast<size_t>(k)] = v;
        }
      }
      detail::store_row(args.output.data(), act_dtype, job.dst, K, y.data());
    }
  }
}

// ---- the classes --------------------------------------------------------------------------------

#define MOEKIT_EMULATION_CTOR(Class)                                                      \
  Class::Class(const MoEConfig& moe, const QuantConfig& quant,                            \
               std::optional<int64_t> max_num_tokens, std::optional<int> num_dispatchers) \
      : CpuEmulationExperts(klass(), moe, quant, max_num_tokens, num_dispatchers) {}

MOEKIT_EMULATION_CTOR(CpuFp8Experts)
MOEKIT_EMULATION_CTOR(CpuInt8Experts)
MOEKIT_EMULATION_CTOR(CpuWna16Experts)
MOEKIT_EMULATION_CTOR(CpuMxfp4Experts)
MOEKIT_EMULATION_CTOR(CpuOcpMxExperts)
MOEKIT_EMULATION_CTOR(CpuNvfp4Experts)
MOEKIT_EMULATION_CTOR(CpuW4A8Experts)
#undef MOEKIT_EMULATION_CTOR

const ExpertsClass& CpuFp8Experts::klass() {
  static const ExpertsClass k(
      emulation_caps(
          "CpuFp8Experts",
          [] {
            // W8A8, and fp8 W8A16 (weight-only) for the same weights.
            std::vector<QuantScheme> v = fp8_w8a8_schemes();
            for (const QuantKey& w : {qk::kFp8StaticTensorSym, qk::kFp8StaticChannelSym,
                                      qk::kFp8Static128BlockSym, qk::kFp8Static128BlockE8M0Sym}) {
              v.push_back({w, std::nullopt});
            }
            return v;
          }(),
          /*deferred=*/false),
      factory_of<CpuFp8Experts>());
  return k;
}

const ExpertsClass& CpuInt8Experts::klass() {
  static const ExpertsClass k(
      emulation_caps("CpuInt8Experts", int8_w8a8_schemes(), /*deferred=*/false),
      factory_of<CpuInt8Experts>());
  return k;
}

const ExpertsClass& CpuWna16Experts::klass() {
  static const ExpertsClass k(emulation_caps("CpuWna16Experts",
                                             {
                                                 {qk::kInt4Static, std::nullopt},
                                                 {qk::kInt4StaticAsym, std::nullopt},
                                                 {qk::kInt4Static32, std::nullopt},
                                                 {qk::kInt4Static32Asym, std::nullopt},
                                                 {qk::kInt8Static, std::nullopt},
                                                 {int8_static_asym_key(), std::nullopt},
                                             },
                                             /*deferred=*/false),
                              factory_of<CpuWna16Experts>());
  return k;
}

const ExpertsClass& CpuMxfp4Experts::klass() {
  static const ExpertsClass k(emulation_caps("CpuMxfp4Experts",
                                             {
                                                 {qk::kMxfp4Static, std::nullopt},
                                                 {qk::kMxfp4Static, qk::kFp8StaticTensorSym},
                                                 {qk::kMxfp4Static, qk::kMxfp8Dynamic},
                                                 {qk::kMxfp4Static, qk::kMxfp4Dynamic},
                                             },
                                             /*deferred=*/false),
                              factory_of<CpuMxfp4Experts>());
  return k;
}

const ExpertsClass& CpuOcpMxExperts::klass() {
  static const ExpertsClass k(emulation_caps("CpuOcpMxExperts",
                                             {
                                                 {qk::kMxfp4Static, qk::kMxfp4Dynamic},
                                                 {qk::kMxfp4Static, qk::kMxfp6E3M2Dynamic},
                                                 {qk::kMxfp4Static, qk::kMxfp6E2M3Dynamic},
                                                 {qk::kMxfp4Static, qk::kFp8StaticTensorSym},
                                                 {qk::kMxfp4Static, std::nullopt},
                                                 {qk::kMxfp6E3M2Static, qk::kMxfp6E3M2Dynamic},
                                                 {qk::kMxfp6E2M3Static, qk::kMxfp6E2M3Dynamic},
                                                 {qk::kMxfp6E3M2Static, qk::kFp8StaticTensorSym},
                                                 {qk::kMxfp6E2M3Static, qk::kFp8StaticTensorSym},
                                             },
                                             /*deferred=*/true),
                              factory_of<CpuOcpMxExperts>());
  return k;
}

const ExpertsClass& CpuNvfp4Experts::klass() {
  static const ExpertsClass k(emulation_caps("CpuNvfp4Experts",
                                             {
                                                 {qk::kNvfp4Static, qk::kNvfp4Dynamic},
                                                 {qk::kNvfp4Static, std::nullopt},
                                             },
                                             /*deferred=*/true),
                              factory_of<CpuNvfp4Experts>());
  return k;
}

const ExpertsClass& CpuW4A8Experts::klass() {
  static const ExpertsClass k(
      emulation_caps("CpuW4A8Experts",
                     {
                         {qk::kInt4W4A8StaticChannelSym, qk::kFp8DynamicTokenSym},
                         {qk::kInt4W4A8StaticChannelSym, qk::kFp8StaticTensorSym},
                         {qk::kInt4W4A8StaticGroup128Sym, qk::kFp8DynamicTokenSym},
                         {qk::kInt4W4A8StaticGroup128Sym, qk::kFp8StaticTensorSym},
                     },
                     /*deferred=*/false),
      factory_of<CpuW4A8Experts>());
  return k;
}

// ---- CpuBatchedEmulationExperts ----------------------------------------------------------------

CpuBatchedEmulationExperts::CpuBatchedEmulationExperts(const ExpertsClass& klass,
                                                       const MoEConfig& moe,
                                                       const QuantConfig& quant,
                                                       std::optional<int64_t> max_num_tokens,
                                                       std::optional<int> num_dispatchers)
    : CpuEmulationExperts(klass, moe, quant, max_num_tokens, num_dispatchers) {
  MOEKIT_CHECK(max_num_tokens && num_dispatchers,
               "{}: max_num_tokens and num_dispatchers must be set for the BatchedExperts "
               "activation format",
               klass.name());
}

namespace {

// The batched twin of a standard emulation class: its schemes, the batched format; `self` is the
// accessor of the record being built (the experts it makes refer to it).
ExpertsClass batched_emulation_class(const char* name, const ExpertsClass& standard,
                                     const ExpertsClass& (*self)()) {
  return ExpertsClass(
      emulation_caps(name, standard.caps().quant_schemes, /*deferred=*/false,
                     ActivationFormat::kBatchedExperts),
      [self](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> mnt,
             std::optional<int> nd) -> std::unique_ptr<Experts> {
        return std::make_unique<CpuBatchedEmulationExperts>(self(), moe, quant, mnt, nd);
      });
}

}  // namespace

const ExpertsClass& CpuBatchedEmulationExperts::fp8_klass() {
  static const ExpertsClass k = batched_emulation_class(
      "CpuBatchedFp8Experts", CpuFp8Experts::klass(), &CpuBatchedEmulationExperts::fp8_klass);
  return k;
}

const ExpertsClass& CpuBatchedEmulationExperts::int8_klass() {
  static const ExpertsClass k = batched_emulation_class(
      "CpuBatchedInt8Experts", CpuInt8Experts::klass(), &CpuBatchedEmulationExperts::int8_klass);
  return k;
}

const ExpertsClass& CpuBatchedEmulationExperts::mxfp4_klass() {
  static const ExpertsClass k = batched_emulation_class(
      "CpuBatchedMxfp4Experts", CpuMxfp4Experts::klass(), &CpuBatchedEmulationExperts::mxfp4_klass);
  return k;
}

ProblemSize CpuBatchedEmulationExperts::moe_problem_size(const Tensor& a1, const Tensor& w1,
                                                         const Tensor& w2,
                                                         const Tensor& topk_ids) const {
  expect_dim(a1, "hidden_states", 3);
  expect_dim(w1, "w1", 3);
  expect_dim(w2, "w2", 3);
  expect_dim(topk_ids, "topk_ids", 2);
  MOEKIT_CHECK(a1.size(0) == w1.size(0), "batched hidden_states {} has {} experts but w1 {} has {}",
               a1.describe(), a1.size(0), w1.describe(), w1.size(0));
  return ProblemSize{w1.size(0), a1.size(1), w1.size(1), w2.size(1), topk_ids.size(1)};
}

WorkspaceShapes CpuBatchedEmulationExperts::workspace_shapes(int64_t, int64_t N, int64_t K, int64_t,
                                                             int64_t, int64_t local_num_experts,
                                                             const ExpertTokensMetadata*,
                                                             Activation activation) const {
  return batched_row_workspace_shapes(local_num_experts, N, K, activation);
}

std::shared_ptr<const TopKWeightAndReduce>
CpuBatchedEmulationExperts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void CpuBatchedEmulationExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  expect_dim(args.hidden_states, "hidden_states", 3);
  expect_dim(args.output, "output", 3);
  MOEKIT_CHECK(args.expert_tokens_meta != nullptr,
               "{} needs expert_tokens_meta (tokens per local expert)", name());
  const int64_t E = args.hidden_states.size(0), T = args.hidden_states.size(1);
  const int64_t Kq = args.hidden_states.size(2), K = args.output.size(2);
  expect_shape(args.output, "output", {E, T, K});
  const std::vector<int64_t> counts = args.expert_tokens_meta->host_counts(E, T, name());
  // Row (e, r) is a token of local expert e when r < count_e; the others compute nothing.
  std::vector<int64_t> ids(static_cast<size_t>(E * T), -1);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < counts[static_cast<size_t>(e)]; ++r)
      ids[static_cast<size_t>(e * T + r)] = e;
  }
  ExpertsApplyArgs flat = args;
  flat.hidden_states = args.hidden_states.view({E * T, Kq});
  flat.output = args.output.view({E * T, 1, K});
  flat.topk_ids = Tensor::from_ints(ids, {E * T, 1}, DType::kInt32);
  const std::vector<float> ones(static_cast<size_t>(E * T), 1.0f);
  flat.topk_weights = Tensor::from_floats(ones, {E * T, 1}, DType::kF32);
  flat.global_num_experts = E;
  flat.expert_map = Tensor{};
  flat.expert_tokens_meta = nullptr;
  if (args.a1q_scale.defined() && args.a1q_scale.dim() == 3) {
    flat.a1q_scale = args.a1q_scale.view({E * T, args.a1q_scale.size(2)});
  }
  CpuEmulationExperts::apply(flat, ctx);
}

// ---- backend registrations: the CPU emulation of each quantized oracle -----------------------

namespace {

ExpertsBackend emulation_backend(QuantOracleKind oracle, std::string name,
                                 std::vector<const ExpertsClass*> classes) {
  ExpertsBackend b;
  b.oracle = oracle;
  b.name = std::move(name);
  b.priority = kPriorityCpu;
  b.classes = std::move(classes);
  b.description = "CPU emulation of the quantized kernels";
  return b;
}

}  // namespace

MOEKIT_REGISTER_EXPERTS_BACKEND(fp8_cpu, [] {
  ExpertsBackend b =
      emulation_backend(QuantOracleKind::kFp8, "cpu",
                        {&CpuFp8Experts::klass(), &CpuBatchedEmulationExperts::fp8_klass()});
  b.aliases = {"emulation"};
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(int8_cpu,
                                emulation_backend(QuantOracleKind::kInt8, "cpu",
                                                  {&CpuInt8Experts::klass(),
                                                   &CpuBatchedEmulationExperts::int8_klass()}));

MOEKIT_REGISTER_EXPERTS_BACKEND(w4a8_cpu, emulation_backend(QuantOracleKind::kW4A8, "cpu",
                                                            {&CpuW4A8Experts::klass()}));

// WNA16: "cpu" on a CPU device, "emulation" on a GPU one (the original's two names).
MOEKIT_REGISTER_EXPERTS_BACKEND(wna16_cpu, [] {
  ExpertsBackend b =
      emulation_backend(QuantOracleKind::kIntWna16, "cpu", {&CpuWna16Experts::klass()});
  b.candidate_on = {DeviceType::kCPU};
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(wna16_emulation, [] {
  ExpertsBackend b =
      emulation_backend(QuantOracleKind::kIntWna16, "emulation", {&CpuWna16Experts::klass()});
  b.candidate_on = {DeviceType::kCUDA};
  return b;
}());

// NVFP4 emulation quantizes after the permutation, with each expert's own global scale.
MOEKIT_REGISTER_EXPERTS_BACKEND(nvfp4_emulation, [] {
  ExpertsBackend b =
      emulation_backend(QuantOracleKind::kNvfp4, "emulation", {&CpuNvfp4Experts::klass()});
  b.traits.per_expert_input_global_scale = true;
  return b;
}());

// OCP MX emulation works on whole MX blocks (32).
MOEKIT_REGISTER_EXPERTS_BACKEND(mxfp4_emulation, [] {
  ExpertsBackend b = emulation_backend(QuantOracleKind::kMxfp4, "emulation",
                                       {&CpuMxfp4Experts::klass(), &CpuOcpMxExperts::klass(),
                                        &CpuBatchedEmulationExperts::mxfp4_klass()});
  b.aliases = {"cpu"};
  b.traits.hidden_align = 32;
  b.traits.intermediate_align = 32;
  return b;
}());

}  // namespace moekit
