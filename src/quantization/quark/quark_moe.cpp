#include "moekit/quantization/quark/quark_moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/nvfp4.h"
#include "moekit/oracle/plan.h"
#include "moekit/oracle/w4a8.h"
#include "moekit/quant/formats.h"

namespace moekit::quark {
namespace {

namespace qk = quant_keys;

Shape strip_trailing_ones(Shape s) {
  while (!s.empty() && s.back() == 1)
    s.pop_back();
  return s;
}

bool compatible_dtype(DType spec, DType got) {
  if (spec == got) return true;
  // Byte-sized codes a checkpoint may store under a neutral dtype.
  if (spec == DType::kUE8M0 || spec == DType::kFp4E2M1x2) return got == DType::kUInt8;
  if (spec == DType::kUInt8) return got == DType::kUE8M0 || got == DType::kFp4E2M1x2;
  return false;
}

// ---- scale checks -------------------------------------------------------------------------

void check_f32_scales(const Tensor& t, std::string_view name, int64_t E) {
  const std::vector<float> v = t.to_float_vector();
  const int64_t per = E > 0 && !v.empty() ? static_cast<int64_t>(v.size()) / E : 1;
  for (size_t i = 0; i < v.size(); ++i) {
    MOEKIT_CHECK(std::isfinite(v[i]) && v[i] > 0.0f,
                 "{}: expert {} holds scale {} at flat index {}; scales must be finite and > 0",
                 name, static_cast<int64_t>(i) / std::max<int64_t>(per, 1), v[i], i);
  }
}

void check_e8m0_scales(const Tensor& t, std::string_view name, int64_t E) {
  const auto* c = t.data_as<const uint8_t>();
  const int64_t n = t.numel();
  const int64_t per = E > 0 ? std::max<int64_t>(n / E, 1) : 1;
  for (int64_t i = 0; i < n; ++i) {
    MOEKIT_CHECK(c[i] != 0xFF,
                 "{}: expert {} holds e8m0 code 0xff (NaN) at flat index {}; scales must be "
                 "finite",
                 name, i / per, i);
  }
}

void check_ue4m3_scales(const Tensor& t, std::string_view name, int64_t E) {
  const auto* c = t.data_as<const uint8_t>();
  const int64_t n = t.numel();
  const int64_t per = E > 0 ? std::max<int64_t>(n / E, 1) : 1;
  for (int64_t i = 0; i < n; ++i) {
    MOEKIT_CHECK((c[i] & 0x80) == 0 && c[i] != 0x7F,
                 "{}: expert {} holds fp8 block scale code {:#04x} ({}) at flat index {}; NVFP4 "
                 "block scales must be finite and >= 0",
                 name, i / per, c[i], quant::decode_e4m3(c[i]), i);
  }
}

// Static per-tensor activation scales (E,): checked; reduced to their max with a warning when the
// experts disagree (the seed's fp8 MoE behaviour).
void reduce_input_scales(ExpertParams& layer, const char* name, int64_t E) {
  if (!layer.has(name)) return;
  const Tensor& t = layer.get(name);
  check_f32_scales(t, name, E);
  const std::vector<float> v = t.to_float_vector();
  const float m = *std::max_element(v.begin(), v.end());
  if (std::any_of(v.begin(), v.end(), [&](float x) { return x != m; })) {
    log::warn_once(
        "Found input_scales that are not equal for a quantized MoE layer; using the maximum "
        "across experts for each layer.");
  }
  layer.replace(name, Tensor::from_floats(std::vector<float>{m}, {1}, DType::kF32));
}

void reduce_input_scales(ExpertParams& layer, int64_t E) {
  reduce_input_scales(layer, "w13_input_scale", E);
  reduce_input_scales(layer, "w2_input_scale", E);
}

// ---- byte-level helpers -----------------------------------------------------------------

const uint8_t* bytes_of(const Tensor& t) {
  return t.data_as<const uint8_t>();
}

// Decodes one row of `cols` values from byte codes (packed per `dtype`).
void decode_row(QuantDType dtype, const uint8_t* row, int64_t cols, float* out) {
  switch (dtype) {
    case QuantDType::kFp8E4M3:
      for (int64_t k = 0; k < cols; ++k)
        out[k] = quant::decode_e4m3(row[k]);
      return;
    case QuantDType::kInt8:
      for (int64_t k = 0; k < cols; ++k)
        out[k] = static_cast<float>(static_cast<int8_t>(row[k]));
      return;
    case QuantDType::kFp4E2M1:
      quant::decode_fp4_e2m1_packed({row, quant::packed_size_4bit(static_cast<size_t>(cols))},
                                    {out, static_cast<size_t>(cols)});
      return;
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      quant::decode_fp6_packed(
          dtype == QuantDType::kFp6E3M2 ? quant::Format::kFp6E3M2 : quant::Format::kFp6E2M3,
          {row, quant::packed_size_6bit(static_cast<size_t>(cols))},
          {out, static_cast<size_t>(cols)});
      return;
    case QuantDType::kInt4:  // uint4b8, low nibble first
      for (int64_t k = 0; k < cols; ++k) {
        const uint8_t b = row[k / 2];
        out[k] = static_cast<float>(((k % 2) == 0 ? (b & 0xF) : (b >> 4)) - 8);
      }
      return;
    default:
      throw Error(fmt::format("decode_row: unsupported dtype {}", quant_dtype_name(dtype)));
  }
}

// Decodes codes (E, R, row_bytes) into f32 (E, R, C), each element times scale(e, r, k).
template <typename ScaleFn>
Tensor dequantize_codes(const Tensor& codes, QuantDType dtype, int64_t C, ScaleFn scale) {
  const int64_t E = codes.size(0), R = codes.size(1), rb = codes.size(2);
  Tensor out = Tensor::empty({E, R, C}, DType::kF32);
  float* o = out.data_as<float>();
  const uint8_t* c = bytes_of(codes);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < R; ++r) {
      float* row = o + (e * R + r) * C;
      decode_row(dtype, c + (e * R + r) * rb, C, row);
      for (int64_t k = 0; k < C; ++k)
        row[k] *= scale(e, r, k);
    }
  }
  return out;
}

int64_t packed_dim(QuantDType dtype, int64_t dim) {
  switch (dtype) {
    case QuantDType::kFp4E2M1:
    case QuantDType::kInt4:
      MOEKIT_CHECK(dim % 2 == 0, "packed 4-bit weights need an even row length, got {}", dim);
      return dim / 2;
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      MOEKIT_CHECK(dim % 4 == 0, "packed fp6 weights need a row length divisible by 4, got {}",
                   dim);
      return dim * 3 / 4;
    default:
      return dim;
  }
}

Tensor column0(const Tensor& t) {
  // (E, S) f32 -> (E,) f32, the first column.
  const int64_t E = t.size(0), S = t.dim() == 2 ? t.size(1) : 1;
  const std::vector<float> v = t.to_float_vector();
  std::vector<float> out(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    out[e] = v[e * S];
  return Tensor::from_floats(out, {E}, DType::kF32);
}

ExpertBiases biases_of(const ExpertParams& layer) {
  return {layer.get_or_none("w13_bias"), layer.get_or_none("w2_bias")};
}

// Static activation scales of both GEMMs, one per expert (checkpoints may store them per expert).
void register_input_scales(ExpertParams& layer, bool static_scales, int64_t E) {
  if (!static_scales) return;
  layer.register_parameter("w13_input_scale", {E}, DType::kF32, 1.0);
  layer.register_parameter("w2_input_scale", {E}, DType::kF32, 1.0);
}

void register_biases(ExpertParams& layer, bool has_bias, int64_t E, int64_t N1, int64_t H) {
  if (!has_bias) return;
  layer.register_parameter("w13_bias", {E, N1}, DType::kF32);
  layer.register_parameter("w2_bias", {E, H}, DType::kF32);
}

// Per-tensor weights: one scale per fused shard (E, S) -> one per expert (E,), the max; the
// shards with a smaller scale are dequantized and re-quantized with it.
void merge_shard_scales(ExpertParams& layer, int shards, bool fp8) {
  Tensor w = layer.get("w13_weight").clone();
  const Tensor& s = layer.get("w13_weight_scale");
  const int64_t E = w.size(0), N1 = w.size(1), H = w.size(2);
  const int64_t rows = N1 / shards;
  const std::vector<float> sv = s.to_float_vector();
  std::vector<float> merged(static_cast<size_t>(E));
  auto* codes = w.data_as<uint8_t>();
  for (int64_t e = 0; e < E; ++e) {
    float m = 0.0f;
    for (int sh = 0; sh < shards; ++sh)
      m = std::max(m, sv[e * shards + sh]);
    merged[e] = m;
    for (int sh = 0; sh < shards; ++sh) {
      const float own = sv[e * shards + sh];
      if (own == m) continue;
      // The new code of each of the 256 codes at this shard's ratio: one table, then a lookup
      // per weight (a mixtral layer's w13 holds 940 M codes).
      std::array<uint8_t, 256> requantized{};
      for (int c = 0; c < 256; ++c) {
        const auto code = static_cast<uint8_t>(c);
        if (fp8) {
          requantized[c] = quant::encode_e4m3(quant::decode_e4m3(code) * own / m);
        } else {
          const float v = static_cast<float>(static_cast<int8_t>(code)) * own / m;
          requantized[c] = static_cast<uint8_t>(quant::encode_int8(v));
        }
      }
      uint8_t* p = codes + (e * N1 + sh * rows) * H;
      for (int64_t i = 0; i < rows * H; ++i)
        p[i] = requantized[p[i]];
    }
  }
  layer.replace("w13_weight", w);
  layer.replace("w13_weight_scale", Tensor::from_floats(merged, {E}, DType::kF32));
}

std::string key_name(const std::optional<QuantKey>& k) {
  return quant_key_to_string(k);
}

std::string hint_text(const TensorHint& h) {
  if (h.empty()) return "None";
  std::vector<std::string> parts;
  for (const QuantSpec& s : h)
    parts.push_back(s.to_string());
  return "[" + fmt::format("{}", fmt::join(parts, "; ")) + "]";
}

}  // namespace

// ---- ExpertParams -------------------------------------------------------------------------

Tensor& ExpertParams::register_parameter(const std::string& name, Shape shape, DType dtype,
                                         double init) {
  Tensor t = zero_fill || init != 0.0 ? Tensor::zeros(shape, dtype) : Tensor::empty(shape, dtype);
  if (init != 0.0) {
    if (dtype == DType::kUInt8 || dtype == DType::kUE8M0) {
      // The seed's torch.ones on uint8 codes: byte value 1.
      std::memset(t.data(), static_cast<int>(init), t.nbytes());
    } else {
      t.fill(init);
    }
  }
  Entry& e = params_[name];
  e.spec = ParamSpec{std::move(shape), dtype};
  e.tensor = std::move(t);
  return e.tensor;
}

bool ExpertParams::has(std::string_view name) const {
  return params_.find(name) != params_.end();
}

const Tensor& ExpertParams::get(std::string_view name) const {
  auto it = params_.find(name);
  MOEKIT_CHECK(it != params_.end(), "MoE layer has no parameter '{}' (it has: {})", name,
               fmt::join(names(), ", "));
  return it->second.tensor;
}

Tensor ExpertParams::get_or_none(std::string_view name) const {
  auto it = params_.find(name);
  return it == params_.end() ? Tensor{} : it->second.tensor;
}

const ParamSpec& ExpertParams::spec(std::string_view name) const {
  auto it = params_.find(name);
  MOEKIT_CHECK(it != params_.end(), "MoE layer has no parameter '{}'", name);
  return it->second.spec;
}

void ExpertParams::load(std::string_view name, const Tensor& value, std::string_view source) {
  auto it = params_.find(name);
  MOEKIT_CHECK(it != params_.end(), "MoE layer has no parameter '{}' to load {} into", name,
               source.empty() ? std::string_view("a tensor") : source);
  const std::string src = source.empty() ? std::string(name) : std::string(source);
  const ParamSpec& spec = it->second.spec;
  MOEKIT_CHECK(value.defined(), "{}: no tensor given for parameter {}", src, name);
  MOEKIT_CHECK(compatible_dtype(spec.dtype, value.dtype()),
               "{}: dtype {} does not match parameter {}, which needs {}", src,
               dtype_name(value.dtype()), name, dtype_name(spec.dtype));
  MOEKIT_CHECK(value.shape() == spec.shape ||
                   (strip_trailing_ones(value.shape()) == strip_trailing_ones(spec.shape) &&
                    value.numel() == numel_of(spec.shape)),
               "{}: shape {} does not match parameter {}, which needs {}", src,
               shape_to_string(value.shape()), name, shape_to_string(spec.shape));
  Tensor v = value.device().is_cpu() ? value : value.to(Device::cpu());
  if (!v.is_contiguous()) v = v.clone();
  it->second.tensor.copy_from(v.reinterpret(spec.shape, spec.dtype));
}

void ExpertParams::replace(std::string_view name, Tensor value) {
  auto it = params_.find(name);
  MOEKIT_CHECK(it != params_.end(), "MoE layer has no parameter '{}' to replace", name);
  it->second.spec = ParamSpec{value.shape(), value.dtype()};
  it->second.tensor = std::move(value);
}

void ExpertParams::erase(std::string_view name) {
  auto it = params_.find(name);
  if (it != params_.end()) params_.erase(it);
}

std::vector<std::string> ExpertParams::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : params_)
    out.push_back(n);
  return out;
}

// ---- selection ----------------------------------------------------------------------------

std::string_view quark_moe_method_name(QuarkMoEScheme scheme) {
  switch (scheme) {
    case QuarkMoEScheme::kW8A8Fp8:
      return "QuarkW8A8Fp8MoEMethod";
    case QuarkMoEScheme::kW4A8Fp8:
      return "QuarkW4A8Fp8MoEMethod";
    case QuarkMoEScheme::kNvfp4:
      return "QuarkNvfp4MoEMethod";
    case QuarkMoEScheme::kOcpMx:
      return "QuarkOCP_MX_MoEMethod";
    case QuarkMoEScheme::kW8A8Int8:
      return "QuarkW8A8Int8MoEMethod";
  }
  return "?";
}

QuarkMoETarget get_moe_method_target(const QuarkConfig& config, std::string_view layer_name,
                                     std::string_view layer_type) {
  const LayerQuantConfig& c = config.find_matched_config(layer_name, layer_type);
  if (!c.output_tensors.empty() || !c.bias.empty()) {
    throw UnsupportedError(
        fmt::format("Currently, Quark models with output_tensors and bias quantized are not "
                    "supported (layer {})",
                    layer_name));
  }
  auto unsupported = [&]() {
    return UnsupportedError(
        fmt::format("Unsupported FusedMoe scheme for layer {}: weight {}, input_tensors {}",
                    layer_name, hint_text(c.weight), hint_text(c.input_tensors)));
  };
  if (c.weight.size() > 1 || c.input_tensors.size() > 1) {
    if (auto m = is_fp8_w4a8(c.weight, c.input_tensors)) {
      return {m->weight_key, m->activation_key, QuarkMoEScheme::kW4A8Fp8};
    }
    if (auto m = is_nvfp4(c.weight, c.input_tensors)) {
      return {m->weight_key, m->activation_key, QuarkMoEScheme::kNvfp4};
    }
    throw unsupported();
  }
  const QuantSpec* w = c.weight.empty() ? nullptr : &c.weight[0];
  const QuantSpec* a = c.input_tensors.empty() ? nullptr : &c.input_tensors[0];
  if (auto m = is_fp8_w8a8(w, a))
    return {m->weight_key, m->activation_key, QuarkMoEScheme::kW8A8Fp8};
  if (auto m = is_w_ocp_mx_a_x(w, a, /*allow_static_fp8=*/true)) {
    return {m->weight_key, m->activation_key, QuarkMoEScheme::kOcpMx};
  }
  if (auto m = is_w8a8_int8(w, a)) {
    return {m->weight_key, m->activation_key, QuarkMoEScheme::kW8A8Int8};
  }
  if (auto m = is_int4_group_w4a8(w, a)) {
    return {m->weight_key, m->activation_key, QuarkMoEScheme::kW4A8Fp8};
  }
  throw unsupported();
}

std::unique_ptr<QuarkMoEMethod> get_moe_method(const QuarkConfig& /*config*/, const MoEConfig& moe,
                                               const QuarkMoETarget& target) {
  if (!target.weight_key) throw UnsupportedError("Unsupported FusedMoe scheme (no weight key)");
  switch (target.scheme) {
    case QuarkMoEScheme::kW4A8Fp8:
      return std::make_unique<QuarkW4A8Fp8MoEMethod>(moe, *target.weight_key,
                                                     target.activation_key);
    case QuarkMoEScheme::kNvfp4:
      return std::make_unique<QuarkNvfp4MoEMethod>(moe, target.activation_key);
    case QuarkMoEScheme::kW8A8Fp8:
      return std::make_unique<QuarkW8A8Fp8MoEMethod>(moe, *target.weight_key,
                                                     target.activation_key);
    case QuarkMoEScheme::kOcpMx:
      return std::make_unique<QuarkOcpMxMoEMethod>(moe, *target.weight_key, target.activation_key);
    case QuarkMoEScheme::kW8A8Int8:
      return std::make_unique<QuarkW8A8Int8MoEMethod>(moe, *target.weight_key,
                                                      target.activation_key);
  }
  throw UnsupportedError("Unsupported FusedMoe scheme");
}

std::optional<std::string> ocp_mx_scheme_from_quant_dtype(const std::optional<std::string>& input,
                                                          const std::string& weight) {
  static const std::vector<std::pair<std::string, std::string>> kAllowed = {
      {"", "mxfp4"},           {"mxfp4", "mxfp4"},
      {"mxfp6_e3m2", "mxfp4"}, {"mxfp6_e2m3", "mxfp4"},
      {"fp8", "mxfp4"},        {"mxfp6_e3m2", "mxfp6_e3m2"},
      {"fp8", "mxfp6_e3m2"},   {"mxfp6_e2m3", "mxfp6_e2m3"},
      {"fp8", "mxfp6_e2m3"},
  };
  const std::string in = input.value_or("");
  for (const auto& [i, w] : kAllowed) {
    if (i == in && w == weight) return in.empty() ? "w_" + w : "w_" + w + "_a_" + in;
  }
  return std::nullopt;
}

// ---- the base method ----------------------------------------------------------------------

QuarkMoEMethod::~QuarkMoEMethod() = default;

QuarkMoEMethod::QuarkMoEMethod(MoEConfig moe, std::optional<QuantKey> weight_key,
                               std::optional<QuantKey> activation_key,
                               const std::vector<std::optional<QuantKey>>& supported_act,
                               const std::vector<QuantKey>& supported_weight)
    : moe_(std::move(moe)),
      weight_key_(std::move(weight_key)),
      activation_key_(std::move(activation_key)) {
  if (std::find(supported_act.begin(), supported_act.end(), activation_key_) ==
      supported_act.end()) {
    throw Error(fmt::format("Unsupported activation quant key: {}", key_name(activation_key_)));
  }
  if (!weight_key_ || std::find(supported_weight.begin(), supported_weight.end(), *weight_key_) ==
                          supported_weight.end()) {
    throw Error(fmt::format("Unsupported weight quant key: {}", key_name(weight_key_)));
  }
}

std::pair<int64_t, int64_t> QuarkMoEMethod::maybe_roundup_sizes(int64_t hidden, int64_t inter,
                                                                DType /*act_dtype*/,
                                                                const ParallelConfig&) const {
  return {hidden, inter};
}

void QuarkMoEMethod::select_backend(QuantOracleKind kind) {
  oracle_kind_ = kind;
  // The communicator comes with the layer (its kernel re-checks the prepare/finalize with it).
  PlanOptions options;
  options.preview = true;
  plan_ = plan_moe(moe_, kind, weight_key_, activation_key_, options);
}

const ExpertsBackend& QuarkMoEMethod::chosen_backend() const {
  plan_.check();
  return *plan_.backend;
}

std::string QuarkMoEMethod::backend() const {
  return plan_.backend ? plan_.backend->name : std::string();
}

void QuarkMoEMethod::finish_loading(const ExpertParams& layer) {
  quant_ = get_fused_moe_quant_config(layer);
  kernel_.reset();
  loaded_ = true;
}

FusedMoEKernel* QuarkMoEMethod::kernel() const {
  MOEKIT_CHECK(loaded_, "{}: apply() or kernel() before process_weights_after_loading()", name());
  if (kernel_ == nullptr) kernel_ = make_kernel(plan_, moe_, quant_);
  return kernel_.get();
}

bool QuarkMoEMethod::is_monolithic() const {
  return plan_.experts != nullptr && plan_.experts->is_monolithic();
}

MoEOutput QuarkMoEMethod::apply(const ExpertParams& layer, const Tensor& x,
                                const Tensor& topk_weights, const Tensor& topk_ids,
                                bool apply_router_weight_on_input, RunContext ctx) const {
  FusedMoEKernel* kernel = this->kernel();
  ModularApplyArgs args;
  args.hidden_states = x;
  args.w1 = layer.get("w13_weight");
  args.w2 = layer.get("w2_weight");
  args.topk_weights = topk_weights;
  args.topk_ids = topk_ids;
  args.activation = moe_.activation;
  args.global_num_experts = moe_.num_experts;
  args.apply_router_weight_on_input = apply_router_weight_on_input;
  return kernel->apply(args, ctx);
}

Tensor QuarkMoEMethod::apply_monolithic(const ExpertParams& layer, const Tensor& x,
                                        const Tensor& router_logits, RunContext ctx) const {
  FusedMoEKernel* kernel = this->kernel();
  MOEKIT_CHECK(is_monolithic(),
               "{}: apply_monolithic() needs a monolithic kernel, but {} is modular", name(),
               kernel->fused_experts().name());
  MonolithicApplyArgs args;
  args.hidden_states = x;
  args.w1 = layer.get("w13_weight");
  args.w2 = layer.get("w2_weight");
  args.router_logits = router_logits;
  args.activation = moe_.activation;
  args.global_num_experts = moe_.num_experts;
  return kernel->apply_monolithic(args, ctx);
}

// ---- fp8 W8A8 -----------------------------------------------------------------------------

QuarkW8A8Fp8MoEMethod::QuarkW8A8Fp8MoEMethod(MoEConfig moe, QuantKey wk, std::optional<QuantKey> ak)
    : QuarkMoEMethod(std::move(moe), wk, ak,
                     {qk::kFp8StaticTensorSym, qk::kFp8DynamicTensorSym, qk::kFp8DynamicTokenSym,
                      qk::kFp8Dynamic128Sym},
                     {qk::kFp8StaticTensorSym, qk::kFp8StaticChannelSym, qk::kFp8Static128BlockSym,
                      qk::kFp8Static128BlockE8M0Sym}) {
  const QuantKey& a = *activation_key_;
  if (wk == qk::kFp8Static128BlockSym || wk == qk::kFp8Static128BlockE8M0Sym) {
    granularity_ = Granularity::kBlock;
    MOEKIT_CHECK(a == qk::kFp8Dynamic128Sym,
                 "For FP8 Fused MoE layers with 128x128 block weights the activations must be "
                 "dynamic (1, 128) groups, found {}",
                 a.to_string());
  } else {
    const bool w_tensor = wk == qk::kFp8StaticTensorSym;
    const bool a_token = a == qk::kFp8DynamicTokenSym;
    granularity_ = w_tensor ? Granularity::kTensor : Granularity::kChannel;
    const bool per_tensor =
        w_tensor && (a == qk::kFp8StaticTensorSym || a == qk::kFp8DynamicTensorSym);
    const bool per_channel = !w_tensor && (a_token || a == qk::kFp8StaticTensorSym);
    if (!(per_tensor || per_channel)) {
      throw Error(fmt::format(
          "For FP8 Fused MoE layers, only per-tensor and per-channel scales for weights and "
          "activations are supported. Found {}, {}",
          w_tensor ? "per_tensor" : "per_channel", a_token ? "per_channel" : "per_tensor"));
    }
    if (per_channel && a == qk::kFp8StaticTensorSym) {
      throw Error(
          "For FP8 Fused MoE layer, we require either per tensor or channelwise, dynamic per "
          "token quantization.");
    }
  }
  static_input_scales_ = a.scale.is_static;
  select_backend(QuantOracleKind::kFp8);
}

void QuarkW8A8Fp8MoEMethod::create_weights(ExpertParams& layer, int64_t E, int64_t H, int64_t I,
                                           DType /*params_dtype*/) const {
  const int64_t S = moe_.w13_num_shards();
  const int64_t N1 = S * I;
  layer.register_parameter("w13_weight", {E, N1, H}, DType::kFp8E4M3);
  layer.register_parameter("w2_weight", {E, H, I}, DType::kFp8E4M3);
  switch (granularity_) {
    case Granularity::kTensor:
      layer.register_parameter("w13_weight_scale", {E, S}, DType::kF32, 1.0);
      layer.register_parameter("w2_weight_scale", {E}, DType::kF32, 1.0);
      break;
    case Granularity::kChannel:
      layer.register_parameter("w13_weight_scale", {E, N1, 1}, DType::kF32, 1.0);
      layer.register_parameter("w2_weight_scale", {E, H, 1}, DType::kF32, 1.0);
      break;
    case Granularity::kBlock: {
      MOEKIT_CHECK(I % 128 == 0 || S == 1,
                   "fp8 128x128 block weights need intermediate_size_per_partition={} to be a "
                   "multiple of 128 (gate and up blocks must not straddle)",
                   I);
      const DType sd = *weight_key_ == qk::kFp8Static128BlockE8M0Sym ? DType::kUE8M0 : DType::kF32;
      const double one = sd == DType::kUE8M0 ? 127.0 : 1.0;
      layer.register_parameter("w13_weight_scale", {E, (N1 + 127) / 128, (H + 127) / 128}, sd, one);
      layer.register_parameter("w2_weight_scale", {E, (H + 127) / 128, (I + 127) / 128}, sd, one);
      break;
    }
  }
  register_input_scales(layer, static_input_scales_, E);
  register_biases(layer, has_bias(), E, N1, H);
}

void QuarkW8A8Fp8MoEMethod::process_weights_after_loading(ExpertParams& layer) {
  const int64_t E = layer.get("w13_weight").size(0);
  for (const char* n : {"w13_weight_scale", "w2_weight_scale"}) {
    const Tensor& s = layer.get(n);
    if (s.dtype() == DType::kUE8M0) {
      check_e8m0_scales(s, n, E);
    } else {
      check_f32_scales(s, n, E);
    }
  }
  reduce_input_scales(layer, E);
  if (granularity_ == Granularity::kTensor) {
    merge_shard_scales(layer, moe_.w13_num_shards(), /*fp8=*/true);
  } else if (granularity_ == Granularity::kChannel) {
    const Tensor& s13 = layer.get("w13_weight_scale");
    const Tensor& s2 = layer.get("w2_weight_scale");
    layer.replace("w13_weight_scale", s13.view({s13.size(0), s13.size(1)}));
    layer.replace("w2_weight_scale", s2.view({s2.size(0), s2.size(1)}));
  }
  finish_loading(layer);
}

QuantConfig QuarkW8A8Fp8MoEMethod::get_fused_moe_quant_config(const ExpertParams& layer) const {
  Fp8W8A8Params p;
  p.w1_scale = layer.get("w13_weight_scale");
  p.w2_scale = layer.get("w2_weight_scale");
  p.a1_scale = layer.get_or_none("w13_input_scale");
  p.a2_scale = layer.get_or_none("w2_input_scale");
  p.per_act_token_quant = *activation_key_ == qk::kFp8DynamicTokenSym;
  p.per_out_ch_quant = granularity_ == Granularity::kChannel;
  if (granularity_ == Granularity::kBlock) p.block_shape = std::pair<int64_t, int64_t>{128, 128};
  p.bias = biases_of(layer);
  p.swiglu = layer.swiglu;
  return Fp8MoEKernelOracle::make_quant_config(chosen_backend(), MoEWeightShape::from(moe_), p);
}

std::pair<Tensor, Tensor> QuarkW8A8Fp8MoEMethod::dequantized_weights(
    const ExpertParams& layer) const {
  auto one = [&](const char* wn, const char* sn) {
    const Tensor& w = layer.get(wn);
    const Tensor& s = layer.get(sn);
    const std::vector<float> sv = s.to_float_vector();  // e8m0 decodes to 2^(c-127)
    const int64_t R = w.size(1), C = w.size(2);
    if (granularity_ == Granularity::kBlock) {
      const int64_t sr = s.size(1), sc = s.size(2);
      return dequantize_codes(w, QuantDType::kFp8E4M3, C, [&](int64_t e, int64_t r, int64_t k) {
        return sv[(e * sr + r / 128) * sc + k / 128];
      });
    }
    const bool channel = granularity_ == Granularity::kChannel;
    return dequantize_codes(w, QuantDType::kFp8E4M3, C, [&](int64_t e, int64_t r, int64_t) {
      return channel ? sv[e * R + r] : sv[e];
    });
  };
  return {one("w13_weight", "w13_weight_scale"), one("w2_weight", "w2_weight_scale")};
}

// ---- int8 W8A8 ----------------------------------------------------------------------------

QuarkW8A8Int8MoEMethod::QuarkW8A8Int8MoEMethod(MoEConfig moe, QuantKey wk,
                                               std::optional<QuantKey> ak)
    : QuarkMoEMethod(
          std::move(moe), wk, ak,
          {qk::kInt8StaticTensorSym, qk::kInt8DynamicTensorSym, qk::kInt8DynamicTokenSym},
          {qk::kInt8StaticChannelSym, qk::kInt8StaticTensorSym}) {
  per_channel_ = wk == qk::kInt8StaticChannelSym;
  static_input_scales_ = activation_key_->scale.is_static;
  select_backend(QuantOracleKind::kInt8);
}

void QuarkW8A8Int8MoEMethod::create_weights(ExpertParams& layer, int64_t E, int64_t H, int64_t I,
                                            DType) const {
  const int64_t S = moe_.w13_num_shards();
  const int64_t N1 = S * I;
  layer.register_parameter("w13_weight", {E, N1, H}, DType::kInt8);
  layer.register_parameter("w2_weight", {E, H, I}, DType::kInt8);
  if (per_channel_) {
    layer.register_parameter("w13_weight_scale", {E, N1, 1}, DType::kF32, 1.0);
    layer.register_parameter("w2_weight_scale", {E, H, 1}, DType::kF32, 1.0);
  } else {
    layer.register_parameter("w13_weight_scale", {E, S}, DType::kF32, 1.0);
    layer.register_parameter("w2_weight_scale", {E}, DType::kF32, 1.0);
  }
  register_input_scales(layer, static_input_scales_, E);
  register_biases(layer, has_bias(), E, N1, H);
}

void QuarkW8A8Int8MoEMethod::process_weights_after_loading(ExpertParams& layer) {
  const int64_t E = layer.get("w13_weight").size(0);
  check_f32_scales(layer.get("w13_weight_scale"), "w13_weight_scale", E);
  check_f32_scales(layer.get("w2_weight_scale"), "w2_weight_scale", E);
  reduce_input_scales(layer, E);
  if (per_channel_) {
    const Tensor& s13 = layer.get("w13_weight_scale");
    const Tensor& s2 = layer.get("w2_weight_scale");
    layer.replace("w13_weight_scale", s13.view({s13.size(0), s13.size(1)}));
    layer.replace("w2_weight_scale", s2.view({s2.size(0), s2.size(1)}));
  } else {
    merge_shard_scales(layer, moe_.w13_num_shards(), /*fp8=*/false);
  }
  finish_loading(layer);
}

QuantConfig QuarkW8A8Int8MoEMethod::get_fused_moe_quant_config(const ExpertParams& layer) const {
  Int8W8A8Params p;
  p.w1_scale = layer.get("w13_weight_scale");
  p.w2_scale = layer.get("w2_weight_scale");
  p.a1_scale = layer.get_or_none("w13_input_scale");
  p.a2_scale = layer.get_or_none("w2_input_scale");
  p.per_act_token_quant = *activation_key_ == qk::kInt8DynamicTokenSym;
  p.per_out_ch_quant = per_channel_;
  p.bias = biases_of(layer);
  p.swiglu = layer.swiglu;
  return int8_w8a8_moe_quant_config(MoEWeightShape::from(moe_), p);
}

std::pair<Tensor, Tensor> QuarkW8A8Int8MoEMethod::dequantized_weights(
    const ExpertParams& layer) const {
  auto one = [&](const char* wn, const char* sn) {
    const Tensor& w = layer.get(wn);
    const std::vector<float> sv = layer.get(sn).to_float_vector();
    const int64_t R = w.size(1);
    return dequantize_codes(w, QuantDType::kInt8, w.size(2), [&](int64_t e, int64_t r, int64_t) {
      return per_channel_ ? sv[e * R + r] : sv[e];
    });
  };
  return {one("w13_weight", "w13_weight_scale"), one("w2_weight", "w2_weight_scale")};
}

// ---- fp8 W4A8 -----------------------------------------------------------------------------

QuarkW4A8Fp8MoEMethod::QuarkW4A8Fp8MoEMethod(MoEConfig moe, QuantKey weight_key,
                                             std::optional<QuantKey> ak)
    : QuarkMoEMethod(std::move(moe), weight_key, ak,
                     {qk::kFp8DynamicTokenSym, qk::kFp8StaticTensorSym},
                     {qk::kInt4W4A8StaticChannelSym, qk::kInt4W4A8StaticGroup128Sym}),
      group_size_(weight_key == qk::kInt4W4A8StaticGroup128Sym ? kGroupSize : -1) {
  static_input_scales_ = activation_key_->scale.is_static;
  select_backend(QuantOracleKind::kW4A8);
}

void QuarkW4A8Fp8MoEMethod::create_weights(ExpertParams& layer, int64_t E, int64_t H, int64_t I,
                                           DType) const {
  const int64_t S = moe_.w13_num_shards();
  const int64_t N1 = S * I;
  layer.register_parameter("w13_weight", {E, N1, packed_dim(QuantDType::kInt4, H)}, DType::kUInt8);
  layer.register_parameter("w2_weight", {E, H, packed_dim(QuantDType::kInt4, I)}, DType::kUInt8);
  if (grouped()) {
    // A tensor-parallel rank's columns of down must start on a group of the checkpoint's rows
    // (its scales are the file's groups from tp_rank * I / 128 on), unless a row is one group.
    MOEKIT_CHECK(
        moe_.parallel.tp_size == 1 || I % kGroupSize == 0 || moe_.intermediate_size <= kGroupSize,
        "int4 groups of {} along K: tensor-parallel rank {} of {} would hold "
        "intermediate_size_per_partition={} columns of down (intermediate_size={}), "
        "not a multiple of {}: a group would straddle two ranks",
        kGroupSize, moe_.parallel.tp_rank, moe_.parallel.tp_size, I, moe_.intermediate_size,
        kGroupSize);
    const int64_t g13 = (H + kGroupSize - 1) / kGroupSize, g2 = (I + kGroupSize - 1) / kGroupSize;
    layer.register_parameter("w13_weight_scale", {E, N1, g13}, DType::kF32, 1.0);
    layer.register_parameter("w2_weight_scale", {E, H, g2}, DType::kF32, 1.0);
  } else {
    layer.register_parameter("w13_weight_scale", {E, N1, 1}, DType::kF32, 1.0);
    layer.register_parameter("w2_weight_scale", {E, H, 1}, DType::kF32, 1.0);
    layer.register_parameter("w13_weight_scale_2", {E, S}, DType::kF32, 1.0);
    layer.register_parameter("w2_weight_scale_2", {E}, DType::kF32, 1.0);
  }
  register_input_scales(layer, static_input_scales_, E);
  register_biases(layer, has_bias(), E, N1, H);
}

void QuarkW4A8Fp8MoEMethod::process_weights_after_loading(ExpertParams& layer) {
  const int64_t E = layer.get("w13_weight").size(0);
  for (const char* n : {"w13_weight_scale", "w2_weight_scale"})
    check_f32_scales(layer.get(n), n, E);
  reduce_input_scales(layer, E);
  // Signed int4 -> uint4b8.
  for (const char* n : {"w13_weight", "w2_weight"}) {
    Tensor w = layer.get(n).clone();
    auto* b = w.data_as<uint8_t>();
    const int64_t bytes = w.numel();
    for (int64_t i = 0; i < bytes; ++i)
      b[i] ^= 0x88;
    layer.replace(n, w);
  }
  if (!grouped()) {
    // Fold the fp8 per-tensor scale into the int4 per-channel one.
    auto fold = [&](const char* sn, const char* s2n, int64_t shards) {
      check_f32_scales(layer.get(s2n), s2n, E);
      const Tensor& s = layer.get(sn);
      const int64_t R = s.size(1);
      const std::vector<float> sv = s.to_float_vector();
      const std::vector<float> s2 = layer.get(s2n).to_float_vector();
      std::vector<float> out(sv.size());
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < R; ++r)
          out[e * R + r] = sv[e * R + r] * s2[e * shards + r / (R / shards)];
      }
      layer.replace(sn, Tensor::from_floats(out, {E, R}, DType::kF32));
      layer.erase(s2n);
    };
    fold("w13_weight_scale", "w13_weight_scale_2", moe_.w13_num_shards());
    fold("w2_weight_scale", "w2_weight_scale_2", 1);
  }
  finish_loading(layer);
}

QuantConfig QuarkW4A8Fp8MoEMethod::get_fused_moe_quant_config(const ExpertParams& layer) const {
  W4A8Fp8Params p;
  p.w1_scale = layer.get("w13_weight_scale");
  p.w2_scale = layer.get("w2_weight_scale");
  p.group_size = group_size_;
  p.a1_scale = layer.get_or_none("w13_input_scale");
  p.a2_scale = layer.get_or_none("w2_input_scale");
  p.bias = biases_of(layer);
  p.swiglu = layer.swiglu;
  return int4_w4afp8_moe_quant_config(MoEWeightShape::from(moe_), p);
}

std::pair<Tensor, Tensor> QuarkW4A8Fp8MoEMethod::dequantized_weights(
    const ExpertParams& layer) const {
  // Scales (E, R, groups): per channel one group of the whole row, else one per kGroupSize of K.
  auto one = [&](const char* wn, const char* sn, int64_t C) {
    const Tensor& w = layer.get(wn);
    const Tensor& s = layer.get(sn);
    const std::vector<float> sv = s.to_float_vector();
    const int64_t R = w.size(1);
    const int64_t G = grouped() ? s.size(2) : 1;
    const int64_t width = grouped() ? kGroupSize : C;
    return dequantize_codes(w, QuantDType::kInt4, C, [&](int64_t e, int64_t r, int64_t c) {
      return sv[(e * R + r) * G + c / width];
    });
  };
  const int64_t H = moe_.hidden_dim, I = moe_.intermediate_size_per_partition();
  return {one("w13_weight", "w13_weight_scale", H), one("w2_weight", "w2_weight_scale", I)};
}

// ---- NVFP4 --------------------------------------------------------------------------------

QuarkNvfp4MoEMethod::QuarkNvfp4MoEMethod(MoEConfig moe, std::optional<QuantKey> ak)
    : QuarkMoEMethod(std::move(moe), qk::kNvfp4Static, ak, {qk::kNvfp4Dynamic, std::nullopt},
                     {qk::kNvfp4Static}) {
  select_backend(QuantOracleKind::kNvfp4);
}

void QuarkNvfp4MoEMethod::create_weights(ExpertParams& layer, int64_t E, int64_t H, int64_t I,
                                         DType) const {
  const int64_t S = moe_.w13_num_shards();
  const int64_t N1 = S * I;
  MOEKIT_CHECK(H % kGroupSize == 0 && I % kGroupSize == 0,
               "NVFP4 needs hidden_size={} and intermediate_size_per_partition={} to be multiples "
               "of {}",
               H, I, kGroupSize);
  layer.register_parameter("w13_weight", {E, N1, H / 2}, DType::kUInt8);
  layer.register_parameter("w2_weight", {E, H, I / 2}, DType::kUInt8);
  layer.register_parameter("w13_weight_scale", {E, N1, H / kGroupSize}, DType::kFp8E4M3);
  layer.register_parameter("w2_weight_scale", {E, H, I / kGroupSize}, DType::kFp8E4M3);
  layer.register_parameter("w13_weight_scale_2", {E, S}, DType::kF32, 1.0);
  layer.register_parameter("w2_weight_scale_2", {E}, DType::kF32, 1.0);
  if (activation_key_) {  // W4A4; weight-only (W4A16) checkpoints have no input scales
    layer.register_parameter("w13_input_scale_2", {E, S}, DType::kF32, 1.0);
    layer.register_parameter("w2_input_scale_2", {E}, DType::kF32, 1.0);
  }
  register_biases(layer, has_bias(), E, N1, H);
}

void QuarkNvfp4MoEMethod::process_weights_after_loading(ExpertParams& layer) {
  const int64_t E = layer.get("w13_weight").size(0);
  for (const char* n :
       {"w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale_2", "w2_input_scale_2"}) {
    if (layer.has(n)) check_f32_scales(layer.get(n), n, E);
  }
  for (const char* n : {"w13_weight_scale", "w2_weight_scale"}) {
    const Tensor& s = layer.get(n);
    check_ue4m3_scales(s, n, E);
    layer.replace(n, s.reinterpret(s.shape(), DType::kUE4M3));
  }
  // The fused w13 runs with w1's global scale (as the seed's other NVFP4 MoE paths).
  const Tensor& ws13 = layer.get("w13_weight_scale_2");
  if (moe_.is_act_and_mul() && ws13.dim() == 2 && ws13.size(1) == 2) {
    const std::vector<float> v = ws13.to_float_vector();
    for (int64_t e = 0; e < E; ++e) {
      const float a = v[e * 2], b = v[e * 2 + 1];
      if (std::fabs(a - b) > 1e-8f + 1e-5f * std::fabs(b)) {
        log::warn_once("w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected.");
        break;
      }
    }
  }
  layer.replace("w13_weight_scale_2", column0(ws13));
  finish_loading(layer);
}

QuantConfig QuarkNvfp4MoEMethod::get_fused_moe_quant_config(const ExpertParams& layer) const {
  Nvfp4CheckpointScales s;
  s.w13_weight_scale = layer.get("w13_weight_scale");
  s.w2_weight_scale = layer.get("w2_weight_scale");
  s.w13_weight_scale_2 = layer.get("w13_weight_scale_2");
  s.w2_weight_scale_2 = layer.get("w2_weight_scale_2");
  if (layer.has("w13_input_scale_2")) {
    s.w13_input_scale = layer.get("w13_input_scale_2");
    s.w2_input_scale = layer.get("w2_input_scale_2");
  }
  s.bias = biases_of(layer);
  s.swiglu = layer.swiglu;
  return Nvfp4MoEKernelOracle::make_quant_config(chosen_backend(), MoEWeightShape::from(moe_), s);
}

std::pair<Tensor, Tensor> QuarkNvfp4MoEMethod::dequantized_weights(
    const ExpertParams& layer) const {
  auto one = [&](const char* wn, const char* sn, const char* gn, int64_t C) {
    const Tensor& w = layer.get(wn);
    const Tensor& sf = layer.get(sn);
    const int64_t R = w.size(1), G = sf.size(2);
    const auto* sc = bytes_of(sf);
    const std::vector<float> g = column0(layer.get(gn)).to_float_vector();
    return dequantize_codes(w, QuantDType::kFp4E2M1, C, [&](int64_t e, int64_t r, int64_t k) {
      return quant::decode_ue4m3(sc[(e * R + r) * G + k / kGroupSize]) * g[e];
    });
  };
  const int64_t H = moe_.hidden_dim, I = moe_.intermediate_size_per_partition();
  return {one("w13_weight", "w13_weight_scale", "w13_weight_scale_2", H),
          one("w2_weight", "w2_weight_scale", "w2_weight_scale_2", I)};
}

// ---- OCP MX -------------------------------------------------------------------------------

namespace {

std::optional<std::string> mx_weight_dtype(const QuantKey& k) {
  if (k == qk::kMxfp4Static) return "mxfp4";
  if (k == qk::kMxfp6E3M2Static) return "mxfp6_e3m2";
  if (k == qk::kMxfp6E2M3Static) return "mxfp6_e2m3";
  return std::nullopt;
}

QuantDType mx_element(const std::string& d) {
  if (d == "mxfp4") return QuantDType::kFp4E2M1;
  if (d == "mxfp6_e3m2") return QuantDType::kFp6E3M2;
  return QuantDType::kFp6E2M3;
}

OcpMxDType ocp_dtype(const std::optional<std::string>& d) {
  if (!d) return OcpMxDType::kNone;
  if (*d == "fp8") return OcpMxDType::kFp8;
  if (*d == "mxfp4") return OcpMxDType::kMxfp4;
  if (*d == "mxfp6_e3m2") return OcpMxDType::kMxfp6E3M2;
  return OcpMxDType::kMxfp6E2M3;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

}  // namespace

QuarkOcpMxMoEMethod::QuarkOcpMxMoEMethod(MoEConfig moe, QuantKey wk, std::optional<QuantKey> ak)
    : QuarkMoEMethod(std::move(moe), wk, ak,
                     {qk::kMxfp4Dynamic, qk::kMxfp6E3M2Dynamic, qk::kMxfp6E2M3Dynamic,
                      qk::kFp8DynamicTensorSym, qk::kFp8StaticTensorSym, std::nullopt},
                     {qk::kMxfp4Static, qk::kMxfp6E3M2Static, qk::kMxfp6E2M3Static}) {
  weight_dtype_ = *mx_weight_dtype(wk);
  if (ak == qk::kFp8DynamicTensorSym || ak == qk::kFp8StaticTensorSym) {
    input_dtype_ = "fp8";
  } else if (ak) {
    input_dtype_ = *ak == qk::kMxfp4Dynamic       ? "mxfp4"
                   : *ak == qk::kMxfp6E3M2Dynamic ? "mxfp6_e3m2"
                                                  : "mxfp6_e2m3";
  }
  const auto scheme = ocp_mx_scheme_from_quant_dtype(input_dtype_, weight_dtype_);
  if (!scheme) {
    throw Error(fmt::format(
        "Unsupported OCP MX dtype combination for MoE: input_dtype={}, weight_dtype={}. Check "
        "that the combination is one of OCP_MX_Scheme's members.",
        input_dtype_.value_or("None"), weight_dtype_));
  }
  scheme_ = *scheme;
  static_input_scales_ = ak == qk::kFp8StaticTensorSym;
  for (std::string_view a : {"a_mxfp4", "a_mxfp6_e3m2", "a_mxfp6_e2m3"}) {
    if (ends_with(scheme_, a) && static_input_scales_) {
      throw UnsupportedError(fmt::format(
          "QuarkOCP_MX_MoEMethod with static input scales is currently not implemented for OCP "
          "MX scheme {}.",
          scheme_));
    }
  }
  if (ends_with(scheme_, "a_fp8") && !static_input_scales_) {
    throw UnsupportedError(fmt::format(
        "QuarkOCP_MX_MoEMethod with dynamic input scales is currently not implemented for OCP MX "
        "scheme {}.",
        scheme_));
  }
  // No native backend for this scheme (or none available): emulation.
  select_backend(QuantOracleKind::kMxfp4);
  if (plan_.ok()) log::info_once(fmt::format("Using {} backend for {}", backend(), scheme_));
}

std::pair<int64_t, int64_t> QuarkOcpMxMoEMethod::maybe_roundup_sizes(
    int64_t hidden, int64_t inter, DType act_dtype, const ParallelConfig& parallel) const {
  std::tie(hidden, inter) = QuarkMoEMethod::maybe_roundup_sizes(hidden, inter, act_dtype, parallel);
  // The alignment the chosen backend's kernels need, at least the OCP MX block.
  const BackendTraits& t = chosen_backend().traits;
  const int64_t h = std::max<int64_t>(kBlockSize, t.hidden_align);
  const int64_t i = std::max<int64_t>(kBlockSize, t.intermediate_align);
  return {round_up(hidden, h), round_up(inter, i)};
}

void QuarkOcpMxMoEMethod::create_weights(ExpertParams& layer, int64_t E, int64_t H, int64_t I,
                                         DType) const {
  const int64_t S = moe_.w13_num_shards();
  const int64_t N1 = S * I;
  const QuantDType el = mx_element(weight_dtype_);
  layer.register_parameter("w13_weight", {E, N1, packed_dim(el, H)}, DType::kUInt8);
  layer.register_parameter("w2_weight", {E, H, packed_dim(el, I)}, DType::kUInt8);
  layer.register_parameter("w13_weight_scale", {E, N1, H / kBlockSize}, DType::kUInt8, 1.0);
  layer.register_parameter("w2_weight_scale", {E, H, I / kBlockSize}, DType::kUInt8, 1.0);
  register_biases(layer, has_bias(), E, N1, H);
  register_input_scales(layer, static_input_scales_, E);
}

void QuarkOcpMxMoEMethod::process_weights_after_loading(ExpertParams& layer) {
  const int64_t E = layer.get("w13_weight").size(0);
  for (const char* n : {"w13_weight_scale", "w2_weight_scale"}) {
    const Tensor& s = layer.get(n);
    check_e8m0_scales(s, n, E);
    layer.replace(n, s.reinterpret(s.shape(), DType::kUE8M0));
  }
  reduce_input_scales(layer, E);
  finish_loading(layer);
}

QuantConfig QuarkOcpMxMoEMethod::get_fused_moe_quant_config(const ExpertParams& layer) const {
  MxParams p;
  p.w1_scale = layer.get("w13_weight_scale");
  p.w2_scale = layer.get("w2_weight_scale");
  p.bias = biases_of(layer);
  const MoEWeightShape shape = MoEWeightShape::from(moe_);
  if (scheme_ == "w_mxfp4") return mxfp4_w4a16_moe_quant_config(shape, p);
  if (scheme_ == "w_mxfp4_a_fp8") {
    p.a1_scale = layer.get("w13_input_scale");
    p.a2_scale = layer.get("w2_input_scale");
    return mxfp4_w4a8_moe_quant_config(shape, p);
  }
  if (input_dtype_ == "fp8") {
    // MXFP6 weights with static fp8 activations (w_mxfp6_*_a_fp8): the original has no fused
    // MoE config for them; moekit builds one as for MXFP4's, which the CPU OCP MX emulation and
    // the Hopper MXFP6 experts serve.
    p.a1_scale = layer.get("w13_input_scale");
    p.a2_scale = layer.get("w2_input_scale");
  }
  p.swiglu = layer.swiglu;
  return ocp_mx_moe_quant_config(shape, ocp_dtype(input_dtype_), ocp_dtype(weight_dtype_), p);
}

std::pair<Tensor, Tensor> QuarkOcpMxMoEMethod::dequantized_weights(
    const ExpertParams& layer) const {
  const QuantDType el = mx_element(weight_dtype_);
  auto one = [&](const char* wn, const char* sn, int64_t C) {
    const Tensor& w = layer.get(wn);
    const Tensor& s = layer.get(sn);
    const int64_t R = w.size(1), G = s.size(2);
    const auto* sc = bytes_of(s);
    return dequantize_codes(w, el, C, [&](int64_t e, int64_t r, int64_t k) {
      return quant::decode_e8m0(sc[(e * R + r) * G + k / kBlockSize]);
    });
  };
  const int64_t H = moe_.hidden_dim, I = moe_.intermediate_size_per_partition();
  return {one("w13_weight", "w13_weight_scale", H), one("w2_weight", "w2_weight_scale", I)};
}

// ---- random parameters ----------------------------------------------------------------------

namespace {

// The largest magnitude of a code of the weight format.
float code_max(QuantDType d) {
  switch (d) {
    case QuantDType::kFp8E4M3:
      return 448.0f;
    case QuantDType::kFp8E5M2:
      return 57344.0f;
    case QuantDType::kInt8:
      return 127.0f;
    case QuantDType::kInt4:
      return 7.0f;
    case QuantDType::kFp4E2M1:
      return 6.0f;
    case QuantDType::kFp6E3M2:
      return 28.0f;
    case QuantDType::kFp6E2M3:
      return 7.5f;
    case QuantDType::kNone:
      break;
  }
  return 1.0f;
}

bool ends_with_name(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

void fill_random_parameters(ExpertParams& layer, const QuarkMoEMethod& method, int64_t hidden,
                            int64_t intermediate, uint64_t seed) {
  const QuantDType wd =
      method.weight_quant_key() ? method.weight_quant_key()->dtype : QuantDType::kNone;
  const QuantDType ad =
      method.activation_quant_key() ? method.activation_quant_key()->dtype : QuantDType::kNone;
  const bool nvfp4 = method.name() == quark_moe_method_name(QuarkMoEScheme::kNvfp4);
  const float wmax = code_max(wd);
  const float amax_code = ad == QuantDType::kInt8 ? 127.0f : 448.0f;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 11);
  std::uniform_real_distribution<float> jitter(0.75f, 1.25f);
  for (const std::string& name : layer.names()) {
    // Every rule below writes every element: a fresh tensor replaces the parameter (no copy of
    // the zeros create_weights allocated, no copy back: a deepseek-v3 layer is 11 GB of codes).
    Tensor t = Tensor::empty(layer.get(name).shape(), layer.get(name).dtype());
    const bool w13 = name.rfind("w13_", 0) == 0;
    // Dequantized weights of about 2/sqrt(K); GEMM inputs of about 1 (x) and 4 (intermediate).
    const float target = 2.0f / std::sqrt(static_cast<float>(w13 ? hidden : intermediate));
    const float input_amax = w13 ? 1.0f : 4.0f;
    const int64_t n = t.numel();
    auto* bytes = static_cast<uint8_t*>(t.data());
    if (ends_with_name(name, "_weight")) {
      // Eight random bytes per draw, stored as one word (a deepseek-v3 layer holds 11 GB of fp8
      // codes); e4m3 NaN codes (low 7 bits all set) become 0x7E / 0xFE: t + 1 carries into bit 7
      // of exactly those bytes (t <= 0x7F, so no carry crosses a byte).
      const bool fp8 = t.dtype() == DType::kFp8E4M3;
      const int64_t nbytes = static_cast<int64_t>(t.nbytes());
      auto draw = [&] {
        uint64_t r = rng();
        if (fp8) {
          const uint64_t low7 = r & 0x7F7F7F7F7F7F7F7Full;
          r ^= ((low7 + 0x0101010101010101ull) & 0x8080808080808080ull) >> 7;
        }
        return r;
      };
      static_assert(std::endian::native == std::endian::little, "byte j = bits 8j .. 8j + 7");
      int64_t i = 0;
      for (; i + 8 <= nbytes; i += 8) {
        const uint64_t r = draw();
        std::memcpy(bytes + i, &r, 8);
      }
      if (i < nbytes) {
        const uint64_t r = draw();
        std::memcpy(bytes + i, &r, static_cast<size_t>(nbytes - i));
      }
    } else if (ends_with_name(name, "_weight_scale")) {
      for (int64_t i = 0; i < n; ++i) {
        const float j = jitter(rng);
        if (t.dtype() == DType::kF32) {
          t.data_as<float>()[i] = target / wmax * j;
        } else if (nvfp4) {  // ue4m3 block scales around 1; the global scale carries the size
          bytes[i] = quant::encode_ue4m3(j);
        } else {  // e8m0 (OCP MX)
          bytes[i] = quant::encode_e8m0_floor(target / wmax * j);
        }
      }
    } else if (ends_with_name(name, "_weight_scale_2")) {
      // NVFP4: the global dequantization scale; W4A8: the folded fp8 per-tensor scale.
      for (int64_t i = 0; i < n; ++i)
        t.data_as<float>()[i] = nvfp4 ? target / wmax : 1.0f;
    } else if (ends_with_name(name, "_input_scale")) {
      for (int64_t i = 0; i < n; ++i)
        t.data_as<float>()[i] = input_amax / amax_code * jitter(rng);
    } else if (ends_with_name(name, "_input_scale_2")) {  // NVFP4: amax / (448 * 6)
      for (int64_t i = 0; i < n; ++i)
        t.data_as<float>()[i] = input_amax / (448.0f * 6.0f);
    } else if (ends_with_name(name, "_bias")) {
      std::uniform_real_distribution<float> u(-0.1f, 0.1f);
      for (int64_t i = 0; i < n; ++i)
        store_float(t.data(), t.dtype(), i, u(rng));
    } else {
      throw Error(fmt::format("fill_random_parameters: no rule for parameter {} of {}", name,
                              method.name()));
    }
    layer.replace(name, std::move(t));
  }
}

}  // namespace moekit::quark
