// Capability records of the Hopper experts and their host-side methods (compiled in every build;
// see sm90_experts.h). The launch sequences are device entry points (experts/cuda/sm90_experts.h).
#include "moekit/experts/sm90_experts.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/cuda_seam.h"
#include "core/elementwise.h"
#include "experts/cuda/ep_peer.h"
#include "experts/cuda/sm90/int4_layout.h"
#include "experts/cuda/sm90/mxfp4_layout.h"
#include "experts/cuda/sm90/mxfp6_layout.h"
#include "experts/cuda/sm90_experts.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/quant/formats.h"

namespace moekit {
namespace {

// Shapes the Hopper kernels take: the GEMMs need K and N multiples of 8, the align kernel at most
// 512 local experts, the router and unpermute at most 32 experts per token.
std::string sm90_shape_check(const MoEConfig& moe) {
  const int64_t I = moe.intermediate_size_per_partition();
  if (moe.hidden_dim % 8 != 0)
    return fmt::format("(hidden {} is not a multiple of 8)", moe.hidden_dim);
  if (I % 8 != 0) return fmt::format("(intermediate {} is not a multiple of 8)", I);
  if (moe.num_local_experts > 512) {
    return fmt::format("({} local experts > 512)", moe.num_local_experts);
  }
  if (moe.experts_per_token > 32) return fmt::format("(top_k {} > 32)", moe.experts_per_token);
  return {};
}

// The factory of a Standard-format class constructed from (moe, quant): the batched-format
// arguments are refused by name.
template <typename ExpertsT>
ExpertsClass::Factory standard_format_factory(const char* name) {
  return [name](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_tokens,
                std::optional<int> dispatchers) -> std::unique_ptr<Experts> {
    MOEKIT_CHECK(!max_tokens && !dispatchers,
                 "{}: max_num_tokens and num_dispatchers should only be set for the BatchedExperts "
                 "activation format",
                 name);
    return std::make_unique<ExpertsT>(moe, quant);
  };
}

// The class record of a BatchedExperts-format class: `caps` (a Standard-format class's) renamed,
// in the batched format, with a factory that needs the batched-format arguments.
template <typename ExpertsT>
ExpertsClass batched_format_class(const char* name, ExpertsCapabilities caps,
                                  ExpertsClass::ShapeCheck shape_check) {
  caps.name = name;
  caps.format = ActivationFormat::kBatchedExperts;
  return ExpertsClass(
      std::move(caps),
      [name](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_tokens,
             std::optional<int> dispatchers) -> std::unique_ptr<Experts> {
        MOEKIT_CHECK(max_tokens && dispatchers,
                     "{}: max_num_tokens and num_dispatchers must be set for the BatchedExperts "
                     "activation format",
                     name);
        return std::make_unique<ExpertsT>(moe, quant, *max_tokens, *dispatchers);
      },
      std::move(shape_check));
}

}  // namespace

// NOTE: switching this changes the weight layout the sm90 experts expect (the oracle converts at
// load time); off, GEMM1 writes (rows, 2I) and a separate activation pass follows.
constexpr bool kFusedActivationAvailable = true;

bool sm90_fuses_activation(const MoEConfig& moe) {
  return kFusedActivationAvailable && moe.is_act_and_mul() &&
         moe.intermediate_size_per_partition() % 32 == 0;
}

const ExpertsClass& Sm90GroupedExperts::klass() {
  static const ExpertsClass k(
      [] {
        ExpertsCapabilities c;
        c.name = "Sm90GroupedExperts";
        c.format = ActivationFormat::kStandard;
        c.device_types = {DeviceType::kCUDA};
        c.min_compute_capability = 90;
        c.max_compute_capability = 90;  // wgmma: sm_90a only
        c.activations.assign(all_activations().begin(), all_activations().end());
        c.quant_schemes = {QuantScheme{}};
        c.in_dtypes = {DType::kBF16, DType::kF16};
        return c;
      }(),
      standard_format_factory<Sm90GroupedExperts>("Sm90GroupedExperts"), sm90_shape_check);
  return k;
}

const ExpertsClass& Sm90BatchedExperts::klass() {
  static const ExpertsClass k = batched_format_class<Sm90BatchedExperts>(
      "Sm90BatchedExperts", Sm90GroupedExperts::klass().caps(), sm90_shape_check);
  return k;
}

int sm90::tile_from_config(const MoEConfig& moe, const char* who, cuda::sm90::TileFamily family) {
  if (moe.tile_config == "auto") return -1;
  const int tile = cuda::sm90::find_tile(moe.tile_config, family);
  MOEKIT_CHECK(tile >= 0,
               "{}: tile_config '{}' is not a tile of the Hopper grouped GEMM; valid: auto, {}",
               who, moe.tile_config, cuda::sm90::tile_names(family));
  return tile;
}

std::array<cuda::sm90::GemmShapeKey, 2> sm90::gemm_shape_keys(const MoEConfig& moe,
                                                              cuda::sm90::TileFamily family) {
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const int64_t E = moe.num_local_experts;
  return {cuda::sm90::GemmShapeKey{family, E, moe.is_act_and_mul() ? 2 * I : I, H},
          cuda::sm90::GemmShapeKey{family, E, H, I}};
}

void sm90::choose_tiles(LaunchState& state, const MoEConfig& moe, const char* who,
                        cuda::sm90::TileFamily family) {
  state.family = family;
  state.tile = tile_from_config(moe, who, family);
  for (LaunchState::TunedRows& t : state.tuned)
    t = {};
  if (state.tile >= 0) return;
  const std::shared_ptr<const cuda::sm90::TileTables> tables = cuda::sm90::TileTables::active();
  const auto keys = gemm_shape_keys(moe, family);
  for (int g = 0; g < 2; ++g) {
    LaunchState::TunedRows& t = state.tuned[g];
    const std::vector<const cuda::sm90::TunedTile*> tuned =
        tables->entries_for(moe.device.name, keys[g]);
    if (tuned.empty()) continue;
    std::string rows;
    for (const cuda::sm90::TunedTile* e : tuned) {
      t.m.push_back(e->m);
      t.row.push_back(cuda::sm90::find_tile(e->tile, family));  // a row of family: parse checks
      rows += fmt::format("{}m={} {}", rows.empty() ? "" : ", ", e->m, e->tile);
    }
    log::info(fmt::format("{}: gemm{} ({}, E={}, n={}, k={}) tiles tuned on {} ({}): {}", who,
                          g + 1, cuda::sm90::family_name(family), keys[g].experts, keys[g].n,
                          keys[g].k, moe.device.name, tuned.front()->source, rows));
  }
}

Sm90BatchedExperts::Sm90BatchedExperts(const MoEConfig& moe, const QuantConfig& quant,
                                       int64_t max_num_tokens, int num_dispatchers)
    : Sm90BatchedExperts(klass(), moe, quant, max_num_tokens, num_dispatchers) {
  MOEKIT_CHECK(!quant.is_quantized(), "Sm90BatchedExperts runs unquantized layers only, got {}",
               quant.describe());
  state_->tile = sm90::tile_from_config(moe, "Sm90BatchedExperts");
}

Sm90BatchedExperts::Sm90BatchedExperts(const ExpertsClass& klass, const MoEConfig& moe,
                                       const QuantConfig& quant, int64_t max_num_tokens,
                                       int num_dispatchers)
    : ExpertsModular(klass, moe, quant, max_num_tokens, num_dispatchers),
      state_(std::make_unique<sm90::LaunchState>()) {
  if constexpr (!kCudaBuild) throw_no_cuda(klass.name());
}

Sm90BatchedExperts::~Sm90BatchedExperts() = default;

Sm90StandardExpertsBase::Sm90StandardExpertsBase(const ExpertsClass& klass, const MoEConfig& moe,
                                                 const QuantConfig& quant)
    : ExpertsModular(klass, moe, quant, std::nullopt, std::nullopt),
      state_(std::make_unique<sm90::LaunchState>()) {
  if constexpr (!kCudaBuild) throw_no_cuda(klass.name());
}

Sm90StandardExpertsBase::~Sm90StandardExpertsBase() = default;

Sm90GroupedExperts::Sm90GroupedExperts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, quant) {
  MOEKIT_CHECK(!quant.is_quantized(), "Sm90GroupedExperts runs unquantized layers only, got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90GroupedExperts");
}

std::string Sm90StandardExpertsBase::tile_family() const {
  return cuda::sm90::family_name(state_->family);
}

std::vector<std::string> Sm90StandardExpertsBase::tile_names() const {
  std::vector<std::string> names;
  for (const cuda::sm90::TileConfig& t : cuda::sm90::kTileTable) {
    if (t.family == state_->family) names.emplace_back(t.name);
  }
  return names;
}

void Sm90StandardExpertsBase::force_tile(const std::string& name) {
  MoEConfig moe = moe_config();
  moe.tile_config = name;
  sm90::choose_tiles(*state_, moe, this->name().c_str(), state_->family);
}

void Sm90StandardExpertsBase::allow_decode_pair(bool allow) {
  state_->decode_pair = allow;
}

void Sm90StandardExpertsBase::bind_weights(const Tensor& w1, const Tensor& w2) {
  if constexpr (kCudaBuild) {
    sm90::bind_weights(*state_, w1, w2, moe_config().in_dtype);
  } else {
    throw_no_cuda(name());
  }
}

void Sm90BatchedExperts::bind_weights(const Tensor& w1, const Tensor& w2) {
  if constexpr (kCudaBuild) {
    sm90::bind_weights(*state_, w1, w2, moe_config().in_dtype);
  } else {
    throw_no_cuda(name());
  }
}

WorkspaceShapes Sm90StandardExpertsBase::workspace_shapes(int64_t M, int64_t N, int64_t K,
                                                          int64_t topk, int64_t,
                                                          int64_t local_num_experts,
                                                          const ExpertTokensMetadata*,
                                                          Activation activation) const {
  if constexpr (kCudaBuild) {
    return sm90::grouped_workspace_shapes(moe_config(), quant_config(), state_->packing, M, N, K,
                                          topk, local_num_experts, activation);
  } else {
    throw_no_cuda(name());
  }
}

std::shared_ptr<const TopKWeightAndReduce>
Sm90StandardExpertsBase::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceNoOp>();
}

void Sm90StandardExpertsBase::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  if constexpr (kCudaBuild) {
    sm90::grouped_apply(*this, *state_, args, ctx);
  } else {
    throw_no_cuda(name());
  }
}

WorkspaceShapes Sm90BatchedExperts::workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t,
                                                     int64_t, int64_t local_num_experts,
                                                     const ExpertTokensMetadata*,
                                                     Activation activation) const {
  // M is max_num_tokens * num_dispatchers (T) in the batched format.
  if constexpr (kCudaBuild) {
    return sm90::batched_workspace_shapes(moe_config(), quant_config(), M, N, K, local_num_experts,
                                          activation);
  } else {
    throw_no_cuda(name());
  }
}

std::shared_ptr<const TopKWeightAndReduce> Sm90BatchedExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void Sm90BatchedExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  if constexpr (kCudaBuild) {
    sm90::batched_apply(*this, *state_, args, ctx);
  } else {
    throw_no_cuda(name());
  }
}

// ---- Sm90Fp8Experts, Sm90Int8Experts ----------------------------------------------------------

namespace {

// The shapes the 8-bit (fp8, int8) GEMMs take beside the Hopper ones: rows of 16 bytes (K
// multiples of 16); fp8 blocks are 128x128 only (checked with the weight scales).
std::string sm90_8bit_shape_check(const MoEConfig& moe) {
  if (std::string why = sm90_shape_check(moe); !why.empty()) return why;
  const int64_t I = moe.intermediate_size_per_partition();
  if (moe.hidden_dim % 16 != 0 || I % 16 != 0) {
    return fmt::format("(8-bit rows need hidden {} and intermediate {} multiples of 16)",
                       moe.hidden_dim, I);
  }
  return {};
}

// The packed sub-byte rows (`format`: "int4", "MXFP4", ...) in whole 16-byte chunks of 32
// elements: hidden and intermediate sizes multiples of 32.
std::string packed_rows_check(const MoEConfig& moe, std::string_view format, int64_t multiple) {
  const int64_t I = moe.intermediate_size_per_partition();
  if (moe.hidden_dim % multiple != 0 || I % multiple != 0) {
    return fmt::format("({} rows need hidden {} and intermediate {} multiples of {})", format,
                       moe.hidden_dim, I, multiple);
  }
  return {};
}

// The row order of w13 in the kernel's layout: kernel row r holds standard row source[r].
std::vector<int32_t> kernel_row_sources(int64_t n, const MoEConfig& moe) {
  std::vector<int32_t> source(static_cast<size_t>(n));
  std::iota(source.begin(), source.end(), 0);
  if (!sm90_fuses_activation(moe)) return source;
  std::vector<int64_t> identity(source.begin(), source.end());
  const Tensor index = Tensor::from_ints(identity, {1, n, 1}, DType::kInt32);
  Tensor out = Tensor::empty({1, n, 1}, DType::kInt32);
  interleave_gate_up_blocks(out, index, moe.activation == Activation::kSwigluOai, Stream{});
  std::memcpy(source.data(), out.data(), source.size() * sizeof(int32_t));
  return source;
}

// A weight scale tensor on the host as f32 (e8m0 block scales decoded).
Tensor host_f32_scale(const Tensor& scale) {
  Tensor host = scale.device().is_cpu() ? scale.clone() : scale.to(Device::cpu());
  if (host.dtype() == DType::kF32) return host;
  MOEKIT_CHECK(host.dtype() == DType::kUE8M0, "weight scale {} is not f32 or e8m0",
               host.describe());
  Tensor f = Tensor::empty(host.shape(), DType::kF32);
  const auto* codes = host.data_as<const uint8_t>();
  float* out = f.data_as<float>();
  for (int64_t i = 0; i < host.numel(); ++i)
    out[i] = quant::decode_e8m0(codes[i]);
  return f;
}

// The kernel-layout scales of one weight (w1: n = N1 rows in the kernel's order `source`; w2:
// identity) on `device`: (E,), (E, n), (E, ceil(k / 128), n) for int4 groups of 128 (K-major) or
// (E, ceil(n / 32), ceil(k / 128)) for 128x128 blocks (cuda::WScale).
Tensor kernel_weight_scale(const QuantDesc& w, int64_t E, int64_t n, int64_t k,
                           const std::vector<int32_t>& source, Device device) {
  const Tensor src = host_f32_scale(w.scale);
  const float* s = src.data_as<const float>();
  Tensor out;
  if (w.shape.is_per_tensor()) {
    out = src.view({E});
  } else if (w.shape.is_per_channel()) {
    out = Tensor::empty({E, n}, DType::kF32);
    float* o = out.data_as<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < n; ++r)
        o[e * n + r] = s[e * n + source[static_cast<size_t>(r)]];
    }
  } else if (w.shape == GroupShape{1, 128}) {
    const int64_t kb = (k + 127) / 128;
    MOEKIT_CHECK(src.numel() == E * n * kb, "weight group scales {} (expected ({}, {}, {}))",
                 src.describe(), E, n, kb);
    out = Tensor::empty({E, kb, n}, DType::kF32);
    float* o = out.data_as<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t j = 0; j < kb; ++j) {
        for (int64_t r = 0; r < n; ++r)
          o[(e * kb + j) * n + r] = s[(e * n + source[static_cast<size_t>(r)]) * kb + j];
      }
    }
  } else {
    const int64_t bn = w.shape.row, bk = w.shape.col;
    MOEKIT_CHECK(bn == 128 && bk == 128, "weight blocks {}x{} (the GEMM takes 128x128)", bn, bk);
    const int64_t nb = (n + 127) / 128, kb = (k + 127) / 128, q = (n + 31) / 32;
    out = Tensor::empty({E, q, kb}, DType::kF32);
    float* o = out.data_as<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < q; ++i) {
        // 32 kernel rows come from 32 consecutive standard rows (one 128-row block).
        const int64_t block = source[static_cast<size_t>(32 * i)] / 128;
        for (int64_t j = 0; j < kb; ++j)
          o[(e * q + i) * kb + j] = s[(e * nb + block) * kb + j];
      }
    }
  }
  return device.is_cpu() ? out : out.to(device);
}

// quant with its static activation scales (a1, a2) copied to `device`, where prepare and the
// requantization read them.
QuantConfig with_device_activation_scales(QuantConfig quant, const MoEConfig& moe) {
  const Device device = moe.device.device();
  for (QuantDesc* a : {&quant.a1, &quant.a2}) {
    if (a->scale.defined() && a->scale.device() != device && device.is_cuda()) {
      a->scale = a->scale.to(device);
    }
  }
  return quant;
}

// The weight scales of an 8-bit layer in the kernel's layout (kind and tensors into state).
void bind_weight_scales(sm90::LaunchState& state, const MoEConfig& moe, const QuantConfig& quant) {
  const QuantDesc& w1 = quant.w1;
  state.scales = w1.shape.is_per_tensor()         ? sm90::LaunchState::WeightScales::kTensor
                 : w1.shape.is_per_channel()      ? sm90::LaunchState::WeightScales::kChannel
                 : w1.shape == GroupShape{1, 128} ? sm90::LaunchState::WeightScales::kGroup
                                                  : sm90::LaunchState::WeightScales::kBlock;
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t N = moe.is_act_and_mul() ? 2 * I : I;
  const Device device = moe.device.device();
  std::vector<int32_t> identity(static_cast<size_t>(H));
  std::iota(identity.begin(), identity.end(), 0);
  state.w1_scale = kernel_weight_scale(w1, E, N, H, kernel_row_sources(N, moe), device);
  state.w2_scale = kernel_weight_scale(quant.w2, E, H, I, identity, device);
}

// The class record of a quantized Standard-format class: Sm90GroupedExperts' capabilities with
// `schemes` (and `in_dtypes` when given), its factory, the shape check.
template <typename ExpertsT>
ExpertsClass sm90_quantized_class(const char* name, std::vector<QuantScheme> schemes,
                                  ExpertsClass::ShapeCheck shape_check,
                                  std::vector<DType> in_dtypes = {},
                                  bool expects_unquantized_inputs = false) {
  ExpertsCapabilities c = Sm90GroupedExperts::klass().caps();
  c.name = name;
  c.quant_schemes = std::move(schemes);
  if (!in_dtypes.empty()) c.in_dtypes = std::move(in_dtypes);
  c.expects_unquantized_inputs = expects_unquantized_inputs;
  return ExpertsClass(std::move(c), standard_format_factory<ExpertsT>(name),
                      std::move(shape_check));
}

}  // namespace

const ExpertsClass& Sm90Fp8Experts::klass() {
  static const ExpertsClass k = sm90_quantized_class<Sm90Fp8Experts>(
      "Sm90Fp8Experts", fp8_w8a8_schemes(), sm90_8bit_shape_check);
  return k;
}

Sm90Fp8Experts::Sm90Fp8Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, with_device_activation_scales(quant, moe)) {
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kFp8E4M3 && quant.a1.dtype == QuantDType::kFp8E4M3,
               "Sm90Fp8Experts runs fp8 W8A8 layers only, got {}", quant.describe());
  // Block scales vary along K and run the promoting rows; the others the direct ones.
  if constexpr (kCudaBuild) {
    sm90::choose_tiles(*state_, moe, "Sm90Fp8Experts",
                       sm90::fp8_tile_family(quant.w1.shape, quant.a1.shape));
  }
  bind_weight_scales(*state_, moe, quant);
}

const ExpertsClass& Sm90BatchedFp8Experts::klass() {
  static const ExpertsClass k = batched_format_class<Sm90BatchedFp8Experts>(
      "Sm90BatchedFp8Experts", Sm90Fp8Experts::klass().caps(), sm90_8bit_shape_check);
  return k;
}

Sm90BatchedFp8Experts::Sm90BatchedFp8Experts(const MoEConfig& moe, const QuantConfig& quant,
                                             int64_t max_num_tokens, int num_dispatchers)
    : Sm90BatchedExperts(klass(), moe, with_device_activation_scales(quant, moe), max_num_tokens,
                         num_dispatchers) {
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kFp8E4M3 && quant.a1.dtype == QuantDType::kFp8E4M3,
               "Sm90BatchedFp8Experts runs fp8 W8A8 layers only, got {}", quant.describe());
  if constexpr (kCudaBuild) {
    state_->family = sm90::fp8_tile_family(quant.w1.shape, quant.a1.shape);
    state_->tile = sm90::tile_from_config(moe, "Sm90BatchedFp8Experts", state_->family);
  }
  bind_weight_scales(*state_, moe, quant);
}

const ExpertsClass& Sm90Int8Experts::klass() {
  static const ExpertsClass k = sm90_quantized_class<Sm90Int8Experts>(
      "Sm90Int8Experts", int8_w8a8_schemes(), sm90_8bit_shape_check);
  return k;
}

Sm90Int8Experts::Sm90Int8Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, with_device_activation_scales(quant, moe)) {
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kInt8 && quant.a1.dtype == QuantDType::kInt8 &&
                   (quant.w1.shape.is_per_tensor() || quant.w1.shape.is_per_channel()),
               "Sm90Int8Experts runs int8 W8A8 layers with per-tensor or per-channel weights "
               "only, got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90Int8Experts", cuda::sm90::TileFamily::kInt8);
  bind_weight_scales(*state_, moe, quant);
}

// ---- Sm90W4A8Experts ----------------------------------------------------------------------------

namespace {

// The 8-bit shapes, with whole 16-byte chunks of int4 (32 elements) along K.
std::string sm90_w4a8_shape_check(const MoEConfig& moe) {
  if (std::string why = sm90_8bit_shape_check(moe); !why.empty()) return why;
  return packed_rows_check(moe, "int4", 32);
}

}  // namespace

const ExpertsClass& Sm90W4A8Experts::klass() {
  static const ExpertsClass k = sm90_quantized_class<Sm90W4A8Experts>(
      "Sm90W4A8Experts",
      {{quant_keys::kInt4W4A8StaticChannelSym, quant_keys::kFp8DynamicTokenSym},
       {quant_keys::kInt4W4A8StaticChannelSym, quant_keys::kFp8StaticTensorSym},
       {quant_keys::kInt4W4A8StaticGroup128Sym, quant_keys::kFp8DynamicTokenSym},
       {quant_keys::kInt4W4A8StaticGroup128Sym, quant_keys::kFp8StaticTensorSym}},
      sm90_w4a8_shape_check);
  return k;
}

Sm90W4A8Experts::Sm90W4A8Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, with_device_activation_scales(quant, moe)) {
  const bool groups = quant.w1.shape == GroupShape{1, 128};
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kInt4 && quant.a1.dtype == QuantDType::kFp8E4M3 &&
                   (quant.w1.shape.is_per_channel() || groups) && !quant.w1.zp.defined(),
               "Sm90W4A8Experts runs symmetric int4 weights per channel or in groups of 128 with "
               "fp8 activations only, got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90W4A8Experts",
                     groups ? cuda::sm90::TileFamily::kW4A8Group : cuda::sm90::TileFamily::kW4A8);
  bind_weight_scales(*state_, moe, quant);
  state_->packing = cuda::WPacking::kInt4;
}

// ---- Sm90Mxfp4Fp8Experts -----------------------------------------------------------------------

namespace {

// One MXFP4 weight's e8m0 codes (E, n, ceil(k / 32)) as the kMxfp4A8 rows read them on `device`:
// (E, ceil(k / 128), n) int32 words, word (e, j, r) holding standard row source[r]'s codes of
// groups 4 j .. 4 j + 3 (byte q: group 4 j + q; 0 past K). A NaN code (255) is refused.
Tensor kernel_mx_words(const Tensor& scale, int64_t k, const std::vector<int32_t>& source,
                       Device device, std::string_view name) {
  Tensor host = scale.device().is_cpu() ? scale : scale.to(Device::cpu());
  if (!host.is_contiguous()) host = host.clone();
  expect_dim(host, name, 3);
  const int64_t E = host.size(0), n = host.size(1), g = host.size(2), kb = (k + 127) / 128;
  MOEKIT_CHECK(g == (k + 31) / 32 && static_cast<int64_t>(source.size()) == n,
               "{} {}: expected ({}, {}, {}) e8m0 codes", name, host.describe(), E, source.size(),
               (k + 31) / 32);
  const auto* s = static_cast<const uint8_t*>(host.data());
  Tensor out = Tensor::empty({E, kb, n}, DType::kInt32);
  auto* o = static_cast<uint32_t*>(out.data());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* row = s + (e * n + source[static_cast<size_t>(r)]) * g;
      for (int64_t j = 0; j < kb; ++j) {
        uint32_t word = 0;
        for (int64_t q = 0; q < 4 && 4 * j + q < g; ++q) {
          const uint8_t c = row[4 * j + q];
          MOEKIT_CHECK(c != 0xFF,
                       "{} holds the NaN e8m0 code 0xff at expert {} row {} group {}: scales "
                       "must be finite",
                       name, e, source[static_cast<size_t>(r)], 4 * j + q);
          word |= static_cast<uint32_t>(c) << (8 * q);
        }
        o[(e * kb + j) * n + r] = word;
      }
    }
  }
  return device.is_cpu() ? out : out.to(device);
}

}  // namespace

const ExpertsClass& Sm90Mxfp4Fp8Experts::klass() {
  static const ExpertsClass k = sm90_quantized_class<Sm90Mxfp4Fp8Experts>(
      "Sm90Mxfp4Fp8Experts", {{quant_keys::kMxfp4Static, quant_keys::kFp8StaticTensorSym}},
      [](const MoEConfig& moe) -> std::string {
        if (std::string why = sm90_8bit_shape_check(moe); !why.empty()) return why;
        return packed_rows_check(moe, "MXFP4", 32);
      });
  return k;
}

Sm90Mxfp4Fp8Experts::Sm90Mxfp4Fp8Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, with_device_activation_scales(quant, moe)) {
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kFp4E2M1 && quant.w1.shape == (GroupShape{1, 32}) &&
                   quant.a1.dtype == QuantDType::kFp8E4M3 && quant.a1.scale.defined(),
               "Sm90Mxfp4Fp8Experts runs MXFP4 weights with static per-tensor fp8 activations "
               "only, got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90Mxfp4Fp8Experts", cuda::sm90::TileFamily::kMxfp4A8);
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const int64_t N = moe.is_act_and_mul() ? 2 * I : I;
  std::vector<int32_t> identity(static_cast<size_t>(H));
  std::iota(identity.begin(), identity.end(), 0);
  const Device device = moe.device.device();
  state_->scales = sm90::LaunchState::WeightScales::kMxfp4Words;
  state_->w1_scale =
      kernel_mx_words(quant.w1.scale, H, kernel_row_sources(N, moe), device, "MXFP4 w1 scale");
  state_->w2_scale = kernel_mx_words(quant.w2.scale, I, identity, device, "MXFP4 w2 scale");
  state_->packing = cuda::WPacking::kMxfp4Fp8;
}

Sm90SharedExperts::Sm90SharedExperts(Tensor w13, Tensor w2, Activation activation,
                                     ActivationParams params, int64_t max_num_tokens) {
  if constexpr (!kCudaBuild) throw_no_cuda("Sm90SharedExperts");
  expect_dim(w13, "shared_w13", 2);
  expect_dim(w2, "shared_w2", 2);
  MOEKIT_CHECK(w13.device().is_cuda() && w2.device() == w13.device(),
               "Sm90SharedExperts: weights must be on one CUDA device, got {} and {}",
               w13.describe(), w2.describe());
  const int64_t n = w13.size(0), h = w13.size(1), i = w2.size(1);
  MOEKIT_CHECK(activation_output_dim(activation, n) == i && w2.size(0) == h,
               "Sm90SharedExperts: shared_w13 {} and shared_w2 {} do not form an MLP with {}",
               w13.describe(), w2.describe(), activation_name(activation));
  max_num_tokens_ = max_num_tokens;
  mlp_ = std::make_unique<sm90::SharedMlp>();
  mlp_->offsets = Tensor::empty({2}, DType::kInt32, w13.device());
  mlp_->w13 = std::move(w13);
  mlp_->w2 = std::move(w2);
  mlp_->activation = activation;
  mlp_->params = params;
  if constexpr (kCudaBuild) sm90::prepare_shared(*mlp_);
}

Sm90SharedExperts::~Sm90SharedExperts() = default;

namespace {
constexpr std::string_view kSharedHidden = "shared.hidden";  // (M, N) GEMM1 output
constexpr std::string_view kSharedAct = "shared.act";        // (M, I) activation output
constexpr std::string_view kSharedOut = "shared.out";        // (M, H) the shared experts' output
}  // namespace

std::vector<WorkspaceRequest> Sm90SharedExperts::workspace_requests(int64_t max_num_tokens) const {
  const int64_t m = std::max(max_num_tokens, max_num_tokens_);
  const int64_t n = mlp_->w13.size(0), h = mlp_->w13.size(1), i = mlp_->w2.size(1);
  const size_t es = element_size(mlp_->w13.dtype());
  return {{std::string(kSharedHidden), static_cast<size_t>(m * n) * es},
          {std::string(kSharedAct), static_cast<size_t>(m * i) * es},
          {std::string(kSharedOut), static_cast<size_t>(m * h) * es}};
}

Tensor Sm90SharedExperts::forward(const Tensor& x, RunContext ctx) {
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(ctx.workspace != nullptr,
                 "Sm90SharedExperts needs the workspace manager in RunContext (its slots {}, {}, "
                 "{})",
                 kSharedHidden, kSharedAct, kSharedOut);
    expect_dim(x, "shared_experts_input", 2);
    const int64_t M = x.size(0);
    MOEKIT_CHECK(M <= max_num_tokens_, "shared experts: M={} > max_num_tokens={}", M,
                 max_num_tokens_);
    const DType dt = mlp_->w13.dtype();
    mlp_->hidden = ctx.workspace->get(kSharedHidden, {M, mlp_->w13.size(0)}, dt);
    mlp_->act = ctx.workspace->get(kSharedAct, {M, mlp_->w2.size(1)}, dt);
    mlp_->out = ctx.workspace->get(kSharedOut, {M, mlp_->w13.size(1)}, dt);
    return sm90::shared_forward(*mlp_, x, ctx);
  } else {
    throw_no_cuda("Sm90SharedExperts");
  }
}

// ---- Sm90Mxfp4Experts -------------------------------------------------------------------------

namespace {

// MXFP4 / NVFP4 (`format`) rows are whole 16-byte groups of 32 elements: hidden and intermediate
// multiples of 32; MXFP6 rows (3k / 4 bytes) whole 16-byte chunks: multiples of 64.
ExpertsClass::ShapeCheck sm90_fp4_shape_check(const char* format, int64_t multiple = 32) {
  return [format, multiple](const MoEConfig& moe) -> std::string {
    if (std::string why = sm90_shape_check(moe); !why.empty()) return why;
    if (std::string why = packed_rows_check(moe, format, multiple); !why.empty()) return why;
    if (moe.in_dtype != DType::kBF16) {
      return fmt::format("({} weights run with bf16 activations, got {})", format,
                         dtype_name(moe.in_dtype));
    }
    return {};
  };
}

// The group scale codes (E, n, k / group) of one weight (`name`) with their rows in the kernel's
// order (kernel row r holds standard row source[r]), on `device`: MXFP4's e8m0 codes as they are,
// NVFP4's ue4m3 codes as kernel scale codes (nvfp4_kernel_scale; a negative or NaN one is refused).
Tensor kernel_group_scale(const Tensor& scale, const std::vector<int32_t>& source, Device device,
                          std::string_view name, bool nvfp4) {
  const Tensor host = scale.device().is_cpu() ? scale : scale.to(Device::cpu());
  expect_dim(host, name, 3);
  const int64_t E = host.size(0), n = host.size(1), g = host.size(2);
  MOEKIT_CHECK(static_cast<int64_t>(source.size()) == n, "{} {} has {} rows, the weight {}", name,
               host.describe(), n, source.size());
  Tensor out = Tensor::empty({E, n, g}, DType::kUInt8);
  const Tensor src = host.is_contiguous() ? host : host.clone();
  const auto* s = static_cast<const uint8_t*>(src.data());
  auto* o = out.data_as<uint8_t>();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* from = s + (e * n + source[static_cast<size_t>(r)]) * g;
      uint8_t* to = o + (e * n + r) * g;
      if (!nvfp4) {
        std::memcpy(to, from, static_cast<size_t>(g));
        continue;
      }
      for (int64_t i = 0; i < g; ++i) {
        MOEKIT_CHECK((from[i] & 0x80) == 0 && from[i] != 0x7F,
                     "{} holds ue4m3 code {:#04x} at expert {} row {} group {}: NVFP4 block scales "
                     "must be finite and >= 0",
                     name, from[i], e, source[static_cast<size_t>(r)], i);
        to[i] = cuda::sm90::nvfp4_kernel_scale(from[i]);
      }
    }
  }
  return device.is_cpu() ? out : out.to(device);
}

// The group scales of both weights (of `format`) in the kernel's layout (w13 in its kernel row
// order).
void bind_group_scales(sm90::LaunchState& state, const MoEConfig& moe, const QuantConfig& quant,
                       bool nvfp4, const char* format) {
  const int64_t H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t N = moe.is_act_and_mul() ? 2 * I : I;
  std::vector<int32_t> identity(static_cast<size_t>(H));
  std::iota(identity.begin(), identity.end(), 0);
  const Device device = moe.device.device();
  state.w1_scale = kernel_group_scale(quant.w1.scale, kernel_row_sources(N, moe), device,
                                      fmt::format("{} w1 scale", format), nvfp4);
  state.w2_scale = kernel_group_scale(quant.w2.scale, identity, device,
                                      fmt::format("{} w2 scale", format), nvfp4);
}

// An NVFP4 weight's global scales (E,) f32 x 2^8 on `device` (the kernel's element products carry
// 2^-8: sm90/mxfp4_layout.h).
Tensor kernel_global_scale(const Tensor& alphas, int64_t E, Device device, std::string_view name) {
  expect_defined(alphas, name);
  const std::vector<float> v = alphas.to_float_vector();
  MOEKIT_CHECK(static_cast<int64_t>(v.size()) == E, "{} {} must hold one scale per expert ({})",
               name, alphas.describe(), E);
  std::vector<float> scaled(v.size());
  for (size_t e = 0; e < v.size(); ++e) {
    MOEKIT_CHECK(std::isfinite(v[e]) && v[e] > 0.0f,
                 "{} of expert {} is {}: the global scale must be finite and > 0", name, e, v[e]);
    scaled[e] = v[e] * cuda::sm90::kNvfp4PairExponentScale;
  }
  const Tensor host = Tensor::from_floats(scaled, {E}, DType::kF32);
  return device.is_cpu() ? host : host.to(device);
}

// A static per-tensor activation scale (one value, finite and > 0) repeated for each of the E
// experts, f32 on `device`.
Tensor per_expert_activation_scale(const QuantDesc& desc, int64_t E, Device device,
                                   std::string_view name) {
  MOEKIT_CHECK(
      desc.dtype == QuantDType::kFp8E4M3 && desc.scale.defined() && desc.scale.numel() == 1,
      "{}: MX weights take fp8 activations with one static per-tensor scale, got {}", name,
      desc.scale.defined() ? desc.scale.describe() : std::string("none (dynamic)"));
  const float s = desc.scale.to_float_vector()[0];
  MOEKIT_CHECK(std::isfinite(s) && s > 0.0f, "{} is {}: it must be finite and > 0", name, s);
  const Tensor host =
      Tensor::from_floats(std::vector<float>(static_cast<size_t>(E), s), {E}, DType::kF32);
  return device.is_cpu() ? host : host.to(device);
}

// fp8 activations of MX weights: their static scales, one per expert for the epilogue
// (w*_global: each GEMM's accumulator scale): the kernels multiply e4m3 codes, as bf16, by the
// weights converted to bf16.
void bind_fp8_activation_scales(sm90::LaunchState& state, const MoEConfig& moe,
                                const QuantConfig& quant) {
  const int64_t E = moe.num_local_experts;
  const Device device = moe.device.device();
  state.w1_global = per_expert_activation_scale(quant.a1, E, device, "a1 (w13 input) scale");
  state.w2_global = per_expert_activation_scale(quant.a2, E, device, "a2 (w2 input) scale");
}

}  // namespace

const ExpertsClass& Sm90Mxfp4Experts::klass() {
  // MXFP4 / MXFP6 activations: rounded to their MX values on the GPU inside the experts (exact in
  // bf16), so the prepare hands them over unquantized, as to the CPU OCP MX emulation.
  static const ExpertsClass k = sm90_quantized_class<Sm90Mxfp4Experts>(
      "Sm90Mxfp4Experts",
      {{quant_keys::kMxfp4Static, std::nullopt},
       {quant_keys::kMxfp4Static, quant_keys::kMxfp4Dynamic},
       {quant_keys::kMxfp4Static, quant_keys::kMxfp6E3M2Dynamic},
       {quant_keys::kMxfp4Static, quant_keys::kMxfp6E2M3Dynamic},
       {quant_keys::kMxfp4Static, quant_keys::kFp8StaticTensorSym}},
      sm90_fp4_shape_check("MXFP4"), {DType::kBF16}, /*expects_unquantized_inputs=*/true);
  return k;
}

Sm90Mxfp4Experts::Sm90Mxfp4Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, quant) {
  const bool mx_activations =
      quant.a1.shape == GroupShape{1, 32} &&
      (quant.a1.dtype == QuantDType::kFp4E2M1 || quant.a1.dtype == QuantDType::kFp6E3M2 ||
       quant.a1.dtype == QuantDType::kFp6E2M3);
  const bool fp8_activations = quant.a1.dtype == QuantDType::kFp8E4M3;
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kFp4E2M1 && (quant.w1.shape == GroupShape{1, 32}) &&
                   (quant.a1.dtype == QuantDType::kNone || mx_activations || fp8_activations),
               "Sm90Mxfp4Experts runs MXFP4 weights (e2m1, e8m0 per 32) with bf16, MXFP4, MXFP6 "
               "or fp8 per-tensor activations only, got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90Mxfp4Experts", cuda::sm90::TileFamily::kW4A16);
  state_->scales = sm90::LaunchState::WeightScales::kMxfp4;
  state_->packing = cuda::WPacking::kMxfp4;
  bind_group_scales(*state_, moe, quant, /*nvfp4=*/false, "MXFP4");
  if (fp8_activations) bind_fp8_activation_scales(*state_, moe, quant);
}

// ---- Sm90Mxfp6Experts -------------------------------------------------------------------------

const ExpertsClass& Sm90Mxfp6Experts::klass() {
  // MXFP6 activations: rounded to their MX values on the GPU inside the experts (exact in bf16),
  // so the prepare hands them over unquantized, as to the CPU OCP MX emulation.
  static const ExpertsClass k = sm90_quantized_class<Sm90Mxfp6Experts>(
      "Sm90Mxfp6Experts",
      {{quant_keys::kMxfp6E3M2Static, quant_keys::kMxfp6E3M2Dynamic},
       {quant_keys::kMxfp6E2M3Static, quant_keys::kMxfp6E2M3Dynamic},
       {quant_keys::kMxfp6E3M2Static, quant_keys::kFp8StaticTensorSym},
       {quant_keys::kMxfp6E2M3Static, quant_keys::kFp8StaticTensorSym}},
      sm90_fp4_shape_check("MXFP6", 64), {DType::kBF16}, /*expects_unquantized_inputs=*/true);
  return k;
}

Sm90Mxfp6Experts::Sm90Mxfp6Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, quant) {
  const QuantDType el = quant.w1.dtype;
  const bool fp8_activations = quant.a1.dtype == QuantDType::kFp8E4M3;
  MOEKIT_CHECK(
      (el == QuantDType::kFp6E3M2 || el == QuantDType::kFp6E2M3) &&
          (quant.w1.shape == GroupShape{1, 32}) &&
          ((quant.a1.dtype == el && (quant.a1.shape == GroupShape{1, 32})) || fp8_activations),
      "Sm90Mxfp6Experts runs MXFP6 weights (e3m2 or e2m3, e8m0 per 32) with MXFP6 "
      "activations of the same element or fp8 per-tensor ones only, got {}",
      quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90Mxfp6Experts", cuda::sm90::TileFamily::kW4A16);
  state_->scales = sm90::LaunchState::WeightScales::kMxfp4;  // e8m0 per 32, as MXFP4's
  state_->packing =
      el == QuantDType::kFp6E3M2 ? cuda::WPacking::kMxfp6E3M2 : cuda::WPacking::kMxfp6E2M3;
  bind_group_scales(*state_, moe, quant, /*nvfp4=*/false, "MXFP6");
  if (fp8_activations) bind_fp8_activation_scales(*state_, moe, quant);
}

// ---- Sm90Nvfp4Experts -------------------------------------------------------------------------

const ExpertsClass& Sm90Nvfp4Experts::klass() {
  // The W4A4 key too: the sm90_nvfp4 backend is weight-only (its QuantConfig keeps the
  // activations in bf16, as vLLM's marlin does on Hopper).
  static const ExpertsClass k = sm90_quantized_class<Sm90Nvfp4Experts>(
      "Sm90Nvfp4Experts",
      {{quant_keys::kNvfp4Static, std::nullopt},
       {quant_keys::kNvfp4Static, quant_keys::kNvfp4Dynamic}},
      sm90_fp4_shape_check("NVFP4"), {DType::kBF16});
  return k;
}

Sm90Nvfp4Experts::Sm90Nvfp4Experts(const MoEConfig& moe, const QuantConfig& quant)
    : Sm90StandardExpertsBase(klass(), moe, quant) {
  MOEKIT_CHECK(quant.w1.dtype == QuantDType::kFp4E2M1 && (quant.w1.shape == GroupShape{1, 16}) &&
                   quant.a1.dtype == QuantDType::kNone,
               "Sm90Nvfp4Experts runs NVFP4 weights (e2m1, ue4m3 per 16, a global scale per "
               "expert) with bf16 activations only (the weight-only QuantConfig of the sm90_nvfp4 "
               "backend), got {}",
               quant.describe());
  sm90::choose_tiles(*state_, moe, "Sm90Nvfp4Experts", cuda::sm90::TileFamily::kW4A16);
  state_->scales = sm90::LaunchState::WeightScales::kNvfp4;
  state_->packing = cuda::WPacking::kNvfp4;
  bind_group_scales(*state_, moe, quant, /*nvfp4=*/true, "NVFP4");
  const Device device = moe.device.device();
  const int64_t E = moe.num_local_experts;
  state_->w1_global = kernel_global_scale(quant.w1.alpha_or_gscale, E, device, "NVFP4 g1_alphas");
  state_->w2_global = kernel_global_scale(quant.w2.alpha_or_gscale, E, device, "NVFP4 g2_alphas");
}

// ---- backend registrations (the unquantized oracle) -------------------------------------------

namespace {

// w13 (E, N, K) or its bias (E, N) reordered expert by expert into the fused layout, in place,
// through one expert's worth of scratch.
void interleave_in_place(Tensor& t, bool pairwise, Stream stream) {
  const Tensor rows3 = t.dim() == 2 ? t.view({t.size(0), t.size(1), 1}) : t;
  const size_t row_bytes = static_cast<size_t>(rows3.size(2)) * element_size(t.dtype());
  if (t.device().is_cuda() && row_bytes % 16 != 0) {
    // A bias (rows of one element): the GPU reorder moves 16-byte rows, so reorder a host copy.
    Tensor host = t.to(Device::cpu());
    interleave_in_place(host, pairwise, Stream{});
    t.copy_from(host);
    return;
  }
  Tensor scratch = Tensor::empty({1, rows3.size(1), rows3.size(2)}, t.dtype(), t.device());
  for (int64_t e = 0; e < rows3.size(0); ++e) {
    Tensor expert = rows3.slice(0, e, e + 1);
    scratch.copy_from_async(expert, stream);
    interleave_gate_up_blocks(expert, scratch, pairwise, stream);
  }
  synchronize(stream);  // the scratch is released on return
}

// The inverse on host copies: kernel row r holds standard row source[r].
void deinterleave_on_host(Tensor& t, bool pairwise) {
  const Tensor rows3 = t.dim() == 2 ? t.view({t.size(0), t.size(1), 1}) : t;
  const int64_t E = rows3.size(0), N = rows3.size(1);
  std::vector<int64_t> identity(static_cast<size_t>(N));
  std::iota(identity.begin(), identity.end(), 0);
  const Tensor index = Tensor::from_ints(identity, {1, N, 1}, DType::kInt32);
  Tensor source = Tensor::empty({1, N, 1}, DType::kInt32);
  interleave_gate_up_blocks(source, index, pairwise, Stream{});
  const int32_t* src_row = source.data_as<int32_t>();
  const Tensor kernel = rows3.clone();
  const size_t row_bytes = static_cast<size_t>(rows3.size(2)) * element_size(t.dtype());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < N; ++r) {
      std::memcpy(static_cast<char*>(t.data()) + (e * N + src_row[r]) * row_bytes,
                  static_cast<const char*>(kernel.data()) + (e * N + r) * row_bytes, row_bytes);
    }
  }
}

std::optional<WeightLayout> sm90_weight_layout(const MoEConfig& moe) {
  if (!sm90_fuses_activation(moe)) return std::nullopt;
  // gpt-oss checkpoints interleave gate and up pairwise (row 2i gate, 2i + 1 up).
  const bool pairwise = moe.activation == Activation::kSwigluOai;
  WeightLayout layout;
  layout.name = "w13 gate/up rows in blocks of 32 (activation fused into GEMM1)";
  layout.to_kernel = [pairwise](ExpertWeights& w, const MoEConfig&, Stream stream) {
    interleave_in_place(w.w13, pairwise, stream);
    if (w.w13_bias.defined()) interleave_in_place(w.w13_bias, pairwise, stream);
  };
  layout.to_standard = [pairwise](ExpertWeights& w, const MoEConfig&) {
    deinterleave_on_host(w.w13, pairwise);
    if (w.w13_bias.defined()) deinterleave_on_host(w.w13_bias, pairwise);
  };
  return layout;
}

// MXFP4 codes (uint8 pairs) between the standard and the kernel nibble order, in place: on the
// device by a kernel, on the host by the same permutation (sm90/mxfp4_layout.h).
void reorder_mxfp4_in_place(Tensor& t, bool to_kernel, Stream stream) {
  if (!t.defined()) return;
  if (t.device().is_cuda()) {
    if constexpr (kCudaBuild) sm90::reorder_mxfp4_codes(t, to_kernel, stream);
    return;
  }
  MOEKIT_CHECK(t.is_contiguous() && element_size(t.dtype()) == 1 &&
                   t.numel() % cuda::sm90::kMxfp4GroupBytes == 0,
               "MXFP4 weight {}: not contiguous whole 16-byte groups", t.describe());
  cuda::sm90::mxfp4_reorder_groups(t.data_as<uint8_t>(), t.numel() / cuda::sm90::kMxfp4GroupBytes,
                                   to_kernel);
}

// MXFP6 rows (the last dimension, 3k / 4 bytes) between the standard and the kernel layout
// (sm90/mxfp6_layout.h), in place: on the device by a kernel, on the host by the same functions.
void repack_mxfp6_in_place(Tensor& t, bool to_kernel, Stream stream) {
  if (!t.defined()) return;
  if (t.device().is_cuda()) {
    if constexpr (kCudaBuild) sm90::repack_mxfp6_codes(t, to_kernel, stream);
    return;
  }
  const int64_t row_bytes = t.dim() > 0 ? t.size(t.dim() - 1) : 0;
  MOEKIT_CHECK(
      t.is_contiguous() && element_size(t.dtype()) == 1 && row_bytes > 0 && row_bytes % 48 == 0,
      "MXFP6 weight {}: not contiguous rows of 3k / 4 bytes with k a multiple of 64", t.describe());
  cuda::sm90::mxfp6_repack_rows(t.data_as<uint8_t>(), t.numel() / row_bytes, row_bytes * 4 / 3,
                                to_kernel);
}

// int4 (uint4b8) codes and the W4A8 kernels' split codes, in place (the same swap both ways): on
// the device by a kernel, on the host by the same function (sm90/int4_layout.h).
void split_int4_in_place(Tensor& t, bool /*to_kernel: the swap is its own inverse*/,
                         Stream stream) {
  if (!t.defined()) return;
  if (t.device().is_cuda()) {
    if constexpr (kCudaBuild) sm90::split_int4_codes(t, stream);
    return;
  }
  MOEKIT_CHECK(t.is_contiguous() && element_size(t.dtype()) == 1 && t.numel() % 4 == 0,
               "int4 weight {}: not contiguous whole 4-byte words of codes", t.describe());
  auto* words = static_cast<uint32_t*>(t.data());
  for (int64_t i = 0; i < t.numel() / 4; ++i)
    words[i] = cuda::sm90::int4_split_word(words[i]);
}

// A packed-weight backend's layout: the 16-bit backends' gate/up row blocks (when the activation
// is fused), then both weights' codes rewritten in place by `codes` (to_kernel: true) into the
// W4A16 kernels' layout, which `what` names.
using PackedCodesInPlace = void (*)(Tensor&, bool to_kernel, Stream);
std::optional<WeightLayout> packed_weight_layout(const MoEConfig& moe, const char* what,
                                                 PackedCodesInPlace codes) {
  std::optional<WeightLayout> rows = sm90_weight_layout(moe);
  WeightLayout layout;
  layout.name = (rows ? rows->name + "; " : std::string()) + what;
  layout.to_kernel = [rows, codes](ExpertWeights& w, const MoEConfig& m, Stream stream) {
    if (rows) rows->to_kernel(w, m, stream);
    codes(w.w13, true, stream);
    codes(w.w2, true, stream);
  };
  layout.to_standard = [rows, codes](ExpertWeights& w, const MoEConfig& m) {
    codes(w.w13, false, Stream{});
    codes(w.w2, false, Stream{});
    if (rows) rows->to_standard(w, m);
  };
  return layout;
}

// sm90_mxfp4 / sm90_nvfp4: every group's e2m1 codes in the kernels' nibble order.
std::optional<WeightLayout> sm90_mxfp4_weight_layout(const MoEConfig& moe) {
  return packed_weight_layout(moe,
                              "e2m1 codes of each group of 32 in the W4A16 kernels' nibble order",
                              reorder_mxfp4_in_place);
}

// sm90_w4a8: the int4 codes as split codes (the producer's two-permute lookup).
std::optional<WeightLayout> sm90_w4a8_weight_layout(const MoEConfig& moe) {
  return packed_weight_layout(
      moe, "int4 codes with bits 2 and 3 of each nibble swapped (the W4A8 kernels' split codes)",
      split_int4_in_place);
}

// sm90_mxfp6: every row repacked into the kernels' MXFP6 layout.
std::optional<WeightLayout> sm90_mxfp6_weight_layout(const MoEConfig& moe) {
  return packed_weight_layout(
      moe, "fp6 rows as a low nibble plane (MXFP4 kernel order) + a plane of their top bits",
      repack_mxfp6_in_place);
}

// The Standard-format backends' GEMM tiles by batch size (`moekit explain`).
std::string describe_sm90_grouped_tiles(const MoEConfig& moe, const std::optional<QuantKey>& weight,
                                        const std::optional<QuantKey>& activation) {
  if constexpr (kCudaBuild) return sm90::describe_grouped_tiles(moe, weight, activation);
  return {};
}
// ... of sm90_mxfp4_fp8 (MXFP4 weights on the e4m3 rows).
std::string describe_sm90_mxfp4_fp8_tiles(const MoEConfig& moe,
                                          const std::optional<QuantKey>& weight,
                                          const std::optional<QuantKey>& activation) {
  if constexpr (kCudaBuild) {
    return sm90::describe_grouped_tiles(moe, weight, activation, /*mxfp4_fp8=*/true);
  }
  return {};
}

// The megakernel deployment's forms by batch size (Sm90EpPeerExperts::Launch), then the tiles of
// its launch sequence's local GEMMs.
std::string describe_sm90_ep_peer(const MoEConfig& moe, const std::optional<QuantKey>& weight,
                                  const std::optional<QuantKey>& activation) {
  const int64_t per_token = Sm90EpPeerExperts::kOneLaunchExpertsPerSlot *
                            std::max(1, moe.parallel.ep_size) * moe.experts_per_token;
  const int64_t most = per_token > 0 ? moe.num_experts / per_token : 0;
  const bool bf16_acts = !activation.has_value();
  std::string out =
      most < 1 || !bf16_acts
          ? fmt::format("forward: the launch sequence at every size ({})\n",
                        !bf16_acts ? "the one launch takes unquantized activations only"
                                   : "a token alone would exceed a quarter of a row per expert")
          : fmt::format(
                "forward: one persistent launch (dispatch, CUDA-core GEMMs, combine, sum) up to M "
                "= "
                "{} tokens per rank (4 x {} ranks x M x top_k {} <= {} experts), the launch "
                "sequence above; MOEKIT_EP_PEER_LAUNCH=one|sequence forces a form\n",
                most, std::max(1, moe.parallel.ep_size), moe.experts_per_token, moe.num_experts);
  return out + describe_sm90_grouped_tiles(moe, weight, activation);
}

ExpertsBackend sm90_backend(std::string name, const ExpertsClass& klass, int priority) {
  ExpertsBackend b;
  b.oracle = QuantOracleKind::kUnquantized;
  b.name = std::move(name);
  b.priority = priority;
  b.candidate_on = {DeviceType::kCUDA};
  b.classes = {&klass};
  b.layout = sm90_weight_layout;
  return b;
}

}  // namespace

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_grouped, [] {
  ExpertsBackend b = sm90_backend("sm90_grouped", Sm90GroupedExperts::klass(), kPriorityNativeGpu);
  b.aliases = {"cuda"};
  b.batched_variant = "sm90_batched";
  b.description = "Hopper wgmma grouped GEMMs, standard format";
  b.describe_kernels = describe_sm90_grouped_tiles;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_batched, [] {
  ExpertsBackend b =
      sm90_backend("sm90_batched", Sm90BatchedExperts::klass(), kPriorityNativeGpu + 10);
  b.description = "Hopper wgmma GEMMs on the batched (E, T, H) format";
  return b;
}());

// ---- Sm90EpPeerExperts (methods: sm90_ep_peer.cpp) -----------------------------------------

namespace {

// The megakernel deployment's record over local experts of class `local` (checked by
// `local_shapes`): their schemes, dtypes and shapes, expert parallelism across at most
// cuda::ep::kMaxRanks ranks sharing memory, the pass-through prepare/finalize.
ExpertsClass ep_peer_class(const ExpertsClass& local, ExpertsClass::ShapeCheck local_shapes) {
  ExpertsCapabilities c = local.caps();
  c.name = "Sm90EpPeerExperts";
  c.parallel.requires_ep = true;
  c.parallel.all2all_backends = {All2AllBackend::kMegakernel};
  c.expects_unquantized_inputs = true;
  return ExpertsClass(
      std::move(c), standard_format_factory<Sm90EpPeerExperts>("Sm90EpPeerExperts"),
      [local_shapes = std::move(local_shapes)](const MoEConfig& moe) -> std::string {
        if (std::string why = local_shapes(moe); !why.empty()) return why;
        if (moe.parallel.ep_size > cuda::ep::kMaxRanks) {
          return fmt::format("(ep_size {} > {} ranks sharing memory)", moe.parallel.ep_size,
                             cuda::ep::kMaxRanks);
        }
        if (moe.max_num_tokens <= 0) {
          return fmt::format("(max_num_tokens {} sizes no exchange buffer)", moe.max_num_tokens);
        }
        return {};
      });
}

}  // namespace

const ExpertsClass& Sm90EpPeerExperts::klass() {
  static const ExpertsClass k = ep_peer_class(Sm90GroupedExperts::klass(), sm90_shape_check);
  return k;
}

const ExpertsClass& Sm90EpPeerExperts::mxfp4_klass() {
  static const ExpertsClass k =
      ep_peer_class(Sm90Mxfp4Experts::klass(), sm90_fp4_shape_check("MXFP4"));
  return k;
}

const ExpertsClass& Sm90EpPeerExperts::nvfp4_klass() {
  static const ExpertsClass k =
      ep_peer_class(Sm90Nvfp4Experts::klass(), sm90_fp4_shape_check("NVFP4"));
  return k;
}

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_ep_peer, [] {
  // Before sm90_grouped, which never serves the megakernel deployment (nor this one another).
  ExpertsBackend b =
      sm90_backend("sm90_ep_peer", Sm90EpPeerExperts::klass(), kPriorityNativeGpu - 1);
  b.description =
      "expert parallelism through the ranks' memory (CUDA IPC), behind the megakernel's "
      "pass-through prepare/finalize: dispatch, the GEMMs on the received rows, combine and the "
      "sum of the partials; at decode sizes one persistent launch (CUDA-core GEMMs), above them "
      "a stream of launches with the Hopper grouped GEMMs";
  b.describe_kernels = describe_sm90_ep_peer;
  return b;
}());

// ---- backend registrations (the quantized oracles) --------------------------------------------

namespace {

// A Hopper backend of a quantized oracle: alias "cuda", native-GPU priority; `size_align` (> 0)
// the hidden / intermediate alignment its kernels need (packed sub-byte rows: 32, as
// packed_rows_check).
ExpertsBackend sm90_quantized_backend(std::string name, const ExpertsClass& klass,
                                      QuantOracleKind oracle, std::string description,
                                      int size_align = 0) {
  ExpertsBackend b = sm90_backend(std::move(name), klass, kPriorityNativeGpu);
  b.describe_kernels = describe_sm90_grouped_tiles;
  b.oracle = oracle;
  b.aliases = {"cuda"};
  b.description = std::move(description);
  if (size_align > 0) b.traits.hidden_align = b.traits.intermediate_align = size_align;
  return b;
}

}  // namespace

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_fp8, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_fp8", Sm90Fp8Experts::klass(), QuantOracleKind::kFp8,
      "Hopper e4m3 wgmma grouped GEMMs: 128x128 block / per-tensor / per-channel weights, block "
      "scales promoted per 128 of K, the others accumulated in the tensor cores");
  b.batched_variant = "sm90_fp8_batched";
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_fp8_batched, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_fp8_batched", Sm90BatchedFp8Experts::klass(), QuantOracleKind::kFp8,
      "Hopper e4m3 wgmma GEMMs on the batched (E, T, H) format (the low-latency exchange's fp8 "
      "dispatch): sm90_fp8's schemes and kernels");
  b.aliases = {};  // the fp8 oracle's "cuda" is sm90_fp8
  b.priority = kPriorityNativeGpu + 10;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_mxfp4, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_mxfp4", Sm90Mxfp4Experts::klass(), QuantOracleKind::kMxfp4,
      "Hopper bf16 wgmma grouped GEMMs on MXFP4 weights (gpt-oss W4A16): packed e2m1 streamed "
      "and converted to bf16 with its e8m0 scale per 32, into registers (swap-AB, a few rows "
      "per expert) or shared memory",
      /*size_align=*/32);
  b.layout = sm90_mxfp4_weight_layout;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_mxfp6, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_mxfp6", Sm90Mxfp6Experts::klass(), QuantOracleKind::kMxfp4,
      "Hopper bf16 wgmma grouped GEMMs on MXFP6 weights with MXFP6 activations (Hopper has no "
      "fp6 tensor cores): the rows repacked at load into a nibble plane and a plane of top bits, "
      "streamed at 6.25 bits per weight and converted exactly to bf16 with their e8m0 scale per "
      "32, the activations rounded to their MXFP6 values",
      /*size_align=*/64);
  b.aliases = {};  // the MXFP4 oracle's "cuda" is sm90_mxfp4
  b.layout = sm90_mxfp6_weight_layout;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_nvfp4, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_nvfp4", Sm90Nvfp4Experts::klass(), QuantOracleKind::kNvfp4,
      "Hopper bf16 wgmma grouped GEMMs on NVFP4 weights, weight-only (Hopper has no fp4 tensor "
      "cores: activations stay bf16 and a checkpoint's input scales are not used, as vLLM's "
      "marlin): packed e2m1 converted to bf16 with its ue4m3 scale per 16, the global scale "
      "in the epilogue",
      /*size_align=*/32);
  b.layout = sm90_mxfp4_weight_layout;
  b.traits.weight_only = true;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_w4a8, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_w4a8", Sm90W4A8Experts::klass(), QuantOracleKind::kW4A8,
      "Hopper e4m3 wgmma grouped GEMMs on int4 weights (per channel, or per channel and 128 of "
      "K) with fp8 activations: the packed int4 streamed and converted exactly to e4m3 by the "
      "producer warpgroup, accumulated over all of K (groups: promoted every K step), the "
      "scales in the epilogue",
      /*size_align=*/32);
  b.layout = sm90_w4a8_weight_layout;
  return b;
}());

// After sm90_mxfp4 (which runs the same pair on the bf16 wgmma) until measured on a GPU.
MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_mxfp4_fp8, [] {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_mxfp4_fp8", Sm90Mxfp4Fp8Experts::klass(), QuantOracleKind::kMxfp4,
      "Hopper e4m3 wgmma grouped GEMMs on MXFP4 weights with static fp8 activations (Quark "
      "w_mxfp4_a_fp8): each group of 32 converted exactly to e4m3 with its e8m0 scale relative to "
      "its row's reference per 128 of K, every K step promoted with the reference scales",
      /*size_align=*/32);
  b.aliases = {};  // the MXFP4 oracle's "cuda" is sm90_mxfp4
  b.priority = kPriorityNativeGpu + 5;
  b.describe_kernels = describe_sm90_mxfp4_fp8_tiles;
  return b;
}());

MOEKIT_REGISTER_EXPERTS_BACKEND(
    sm90_int8, sm90_quantized_backend(
                   "sm90_int8", Sm90Int8Experts::klass(), QuantOracleKind::kInt8,
                   "Hopper s8 wgmma grouped GEMMs: per-tensor / per-channel weights, per-token / "
                   "per-tensor activations, exact int32 accumulation"));

// The megakernel deployment in the MXFP4 and NVFP4 oracles (the same name as the unquantized
// oracle's: `--backend sm90_ep_peer` in each), with the layout of sm90_mxfp4 / sm90_nvfp4 (both
// the MXFP4 kernel nibble order) and, for NVFP4, its weight-only activations.
namespace {

ExpertsBackend sm90_ep_peer_fp4_backend(const ExpertsClass& klass, QuantOracleKind oracle,
                                        const char* format, bool weight_only) {
  ExpertsBackend b = sm90_quantized_backend(
      "sm90_ep_peer", klass, oracle,
      fmt::format("expert parallelism through the ranks' memory (CUDA IPC) on {} weights{}: "
                  "sm90_ep_peer's exchange around the {} GEMMs; at decode sizes with bf16 "
                  "activations one persistent launch",
                  format, weight_only ? ", weight-only" : "", format),
      /*size_align=*/32);
  b.aliases = {};  // the oracle's "cuda" is its single-GPU backend
  b.priority = kPriorityNativeGpu - 1;
  b.layout = sm90_mxfp4_weight_layout;
  b.traits.weight_only = weight_only;
  b.describe_kernels = describe_sm90_ep_peer;
  return b;
}

}  // namespace

MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_ep_peer_mxfp4,
                                sm90_ep_peer_fp4_backend(Sm90EpPeerExperts::mxfp4_klass(),
                                                         QuantOracleKind::kMxfp4, "MXFP4",
                                                         /*weight_only=*/false));
MOEKIT_REGISTER_EXPERTS_BACKEND(sm90_ep_peer_nvfp4,
                                sm90_ep_peer_fp4_backend(Sm90EpPeerExperts::nvfp4_klass(),
                                                         QuantOracleKind::kNvfp4, "NVFP4",
                                                         /*weight_only=*/true));

}  // namespace moekit
