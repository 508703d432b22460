#include "moekit/layer/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moekit/core/error.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/io/safetensors.h"
#include "moekit/quant/moe_input_quant.h"

namespace moekit {
namespace {

using json = nlohmann::json;

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F32") return DType::kF32;
  if (s == "F64") return DType::kF64;
  if (s == "F8_E4M3") return DType::kFp8E4M3;
  if (s == "F8_E5M2") return DType::kFp8E5M2;
  if (s == "F8_E8M0") return DType::kUE8M0;
  if (s == "I8") return DType::kInt8;
  if (s == "U8") return DType::kUInt8;
  if (s == "I32") return DType::kInt32;
  if (s == "I64") return DType::kInt64;
  if (s == "BOOL") return DType::kBool;
  return std::nullopt;
}

bool is_float_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

json read_config_json(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "config.json";
  std::ifstream in(file);
  MOEKIT_CHECK(in.good(), "cannot open {} (a checkpoint directory needs a config.json)",
               file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  try {
    json j = json::parse(text);
    MOEKIT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", file.string(), j.type_name());
    return j;
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON (byte {}): {}", file.string(), e.byte, e.what()));
  }
}

// The checkpoint's view of one tensor, converted to a CPU Tensor.
class Reader {
 public:
  explicit Reader(const std::filesystem::path& dir) {
    try {
      ckpt_ = io::CheckpointDir::open(dir);
    } catch (const io::SafetensorsError& e) {
      throw Error(e.what());
    }
  }
  bool contains(const std::string& name) const { return ckpt_.contains(name); }
  std::string dtype_string(const std::string& name) const { return ckpt_.find(name).dtype; }
  Tensor read(const std::string& name) const {
    MOEKIT_CHECK(ckpt_.contains(name), "tensor '{}' not found in checkpoint {} ({} tensors)", name,
                 ckpt_.dir().string(), ckpt_.size());
    const io::TensorInfo& info = ckpt_.find(name);
    const auto dt = dtype_from_safetensors(info.dtype);
    MOEKIT_CHECK(dt.has_value(), "tensor '{}' has dtype {}, which moekit does not load", name,
                 info.dtype);
    Tensor t = Tensor::empty(info.shape, *dt);
    MOEKIT_CHECK(t.nbytes() == info.bytes.size(),
                 "tensor '{}': {} bytes for shape {} {} (expected {})", name, info.bytes.size(),
                 shape_to_string(info.shape), info.dtype, t.nbytes());
    if (t.nbytes() > 0) std::memcpy(t.data(), info.bytes.data(), t.nbytes());
    return t;
  }
  const std::filesystem::path& dir() const { return ckpt_.dir(); }

 private:
  io::CheckpointDir ckpt_;
};

// Tensor names of one MoE layer.
struct LayerNames {
  std::string moe_prefix;  // model.layers.N.mlp / model.layers.N.block_sparse_moe
  std::string gate, up, down;
  std::string expert(int64_t e, const std::string& proj, const std::string& param) const {
    return fmt::format("{}.experts.{}.{}.{}", moe_prefix, e, proj, param);
  }
};

LayerNames find_names(const Reader& r, int n, const ModelPreset& model) {
  const std::string qwen = fmt::format("model.layers.{}.mlp", n);
  const std::string mixtral = fmt::format("model.layers.{}.block_sparse_moe", n);
  if (r.contains(qwen + ".experts.0.gate_proj.weight") ||
      r.contains(qwen + ".experts.0.up_proj.weight")) {
    return {qwen, "gate_proj", "up_proj", "down_proj"};
  }
  if (r.contains(mixtral + ".experts.0.w1.weight")) return {mixtral, "w1", "w3", "w2"};
  MOEKIT_CHECK(n >= 0 && (model.num_layers == 0 || n < model.num_layers),
               "layer {} is out of range: the model has num_hidden_layers={}", n, model.num_layers);
  MOEKIT_CHECK(n >= model.first_moe_layer,
               "layer {} is a dense layer (first_k_dense_replace={}), not an MoE layer", n,
               model.first_moe_layer);
  throw Error(fmt::format(
      "no MoE expert tensors for layer {} in {}: looked for '{}.experts.0.gate_proj.weight' and "
      "'{}.experts.0.w1.weight'",
      n, r.dir().string(), qwen, mixtral));
}

Shape squeeze_trailing(Shape s) {
  while (!s.empty() && s.back() == 1)
    s.pop_back();
  return s;
}

bool shape_matches(const Shape& got, const Shape& want) {
  return got == want ||
         (squeeze_trailing(got) == squeeze_trailing(want) && numel_of(got) == numel_of(want));
}

bool byte_compatible(DType want, DType got) {
  if (want == got) return true;
  const bool want_bytes = want == DType::kUE8M0 || want == DType::kUInt8;
  const bool got_bytes = got == DType::kUE8M0 || got == DType::kUInt8;
  return want_bytes && got_bytes;
}

// Reads a per-expert piece, validating shape and dtype against the parameter's needs.
Tensor read_piece(const Reader& r, const std::string& name, const Shape& want, DType want_dtype,
                  const std::string& param) {
  Tensor t = r.read(name);
  MOEKIT_CHECK(shape_matches(t.shape(), want),
               "tensor '{}' has shape {} but parameter {} needs {} per expert and projection", name,
               shape_to_string(t.shape()), param, shape_to_string(want));
  const bool convert = want_dtype == DType::kF32 && is_float_dtype(t.dtype());
  MOEKIT_CHECK(convert || byte_compatible(want_dtype, t.dtype()),
               "tensor '{}' has dtype {} ({}) but parameter {} needs {}", name,
               dtype_name(t.dtype()), r.dtype_string(name), param, dtype_name(want_dtype));
  if (convert && t.dtype() != DType::kF32) t = t.to_dtype(DType::kF32);
  return t;
}

// Fills one Quark parameter from the per-expert checkpoint tensors.
void load_param(const Reader& r, const LayerNames& names, quark::ExpertParams& params,
                const std::string& param, int shards) {
  const quark::ParamSpec spec = params.spec(param);
  const bool w13 = param.rfind("w13_", 0) == 0;
  const std::string suffix = param.substr(w13 ? 4 : 3);
  std::vector<std::string> projs =
      w13 ? std::vector<std::string>{names.gate, names.up} : std::vector<std::string>{names.down};
  projs.resize(w13 ? static_cast<size_t>(shards) : 1);
  const int64_t E = spec.shape[0];
  Tensor staged = Tensor::empty(spec.shape, spec.dtype);
  const int64_t per_expert = numel_of(spec.shape) / std::max<int64_t>(E, 1);
  const size_t esz = element_size(spec.dtype);
  const std::string desc =
      fmt::format("{}.experts.*.{{{}}}.{}", names.moe_prefix, fmt::join(projs, ","), suffix);
  if (spec.shape.size() == 1) {
    // (E,): one scalar per expert; fused shards take their max (static input scales).
    std::vector<float> v(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      float m = -INFINITY;
      for (const std::string& p : projs) {
        const Tensor t = read_piece(r, names.expert(e, p, suffix), {}, DType::kF32, param);
        m = std::max(m, t.to_float_vector()[0]);
      }
      v[e] = m;
    }
    params.load(param, Tensor::from_floats(v, {E}, DType::kF32), desc);
    return;
  }
  // (E, D1, ...): dim 1 split evenly between the shards (gate rows, then up rows).
  const int64_t S = static_cast<int64_t>(projs.size());
  MOEKIT_CHECK(spec.shape[1] % S == 0, "parameter {} dim 1 ({}) does not split into {} shards",
               param, spec.shape[1], S);
  Shape piece(spec.shape.begin() + 1, spec.shape.end());
  piece[0] /= S;
  if (piece.size() == 1 && piece[0] == 1) piece.clear();  // per-tensor: one scalar per shard
  const int64_t piece_numel = numel_of(piece);
  auto* dst = static_cast<char*>(staged.data());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      const Tensor t = read_piece(r, names.expert(e, projs[static_cast<size_t>(s)], suffix), piece,
                                  spec.dtype, param);
      std::memcpy(dst + (e * per_expert + s * piece_numel) * esz, t.data(),
                  static_cast<size_t>(piece_numel) * esz);
    }
  }
  params.load(param, staged, desc);
}

// Unquantized expert weights stacked into (E, N1, H) / (E, H, I) in `dtype`.
void load_unquantized(const Reader& r, const LayerNames& names, const MoEConfig& moe, DType dtype,
                      MoELayerWeights& w, bool has_bias) {
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t S = moe.w13_num_shards();
  w.w13 = Tensor::empty({E, S * I, H}, dtype);
  w.w2 = Tensor::empty({E, H, I}, dtype);
  if (has_bias) {
    w.w13_bias = Tensor::empty({E, S * I}, dtype);
    w.w2_bias = Tensor::empty({E, H}, dtype);
  }
  auto put = [&](Tensor& dst, int64_t offset, const std::string& name, const Shape& want) {
    Tensor t = r.read(name);
    MOEKIT_CHECK(shape_matches(t.shape(), want), "tensor '{}' has shape {} but the layer needs {}",
                 name, shape_to_string(t.shape()), shape_to_string(want));
    MOEKIT_CHECK(is_float_dtype(t.dtype()),
                 "tensor '{}' has dtype {}: an unquantized layer needs BF16, F16 or F32 weights "
                 "(is quantization_config missing from config.json?)",
                 name, r.dtype_string(name));
    const std::vector<float> v = t.to_float_vector();
    for (size_t i = 0; i < v.size(); ++i)
      store_float(dst.data(), dtype, offset + static_cast<int64_t>(i), v[i]);
  };
  const std::vector<std::string> up_projs =
      S == 2 ? std::vector<std::string>{names.gate, names.up} : std::vector<std::string>{names.up};
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      put(w.w13, (e * S + s) * I * H, names.expert(e, up_projs[static_cast<size_t>(s)], "weight"),
          {I, H});
      if (has_bias) {
        put(w.w13_bias, (e * S + s) * I, names.expert(e, up_projs[static_cast<size_t>(s)], "bias"),
            {I});
      }
    }
    put(w.w2, e * H * I, names.expert(e, names.down, "weight"), {H, I});
    if (has_bias) put(w.w2_bias, e * H, names.expert(e, names.down, "bias"), {H});
  }
}

Tensor read_float(const Reader& r, const std::string& name, const Shape& want) {
  Tensor t = r.read(name);
  MOEKIT_CHECK(shape_matches(t.shape(), want), "tensor '{}' has shape {} but the layer needs {}",
               name, shape_to_string(t.shape()), shape_to_string(want));
  MOEKIT_CHECK(is_float_dtype(t.dtype()),
               "tensor '{}' has dtype {}; moekit loads it unquantized (BF16, F16 or F32 only)",
               name, r.dtype_string(name));
  return t.to_dtype(DType::kF32).view(want);
}

void load_shared(const Reader& r, int n, const ModelPreset& model, Tensor& w13, Tensor& w2) {
  if (model.num_shared_experts <= 0) return;
  const int64_t H = model.hidden_size;
  const int64_t Is = model.shared_intermediate_size * model.num_shared_experts;
  std::string prefix = fmt::format("model.layers.{}.mlp.shared_experts", n);
  if (!r.contains(prefix + ".gate_proj.weight") &&
      r.contains(fmt::format("model.layers.{}.mlp.shared_expert.gate_proj.weight", n))) {
    prefix = fmt::format("model.layers.{}.mlp.shared_expert", n);
  }
  const Tensor g = read_float(r, prefix + ".gate_proj.weight", {Is, H});
  const Tensor u = read_float(r, prefix + ".up_proj.weight", {Is, H});
  w2 = read_float(r, prefix + ".down_proj.weight", {H, Is});
  w13 = Tensor::empty({2 * Is, H}, DType::kF32);
  std::memcpy(w13.data(), g.data(), g.nbytes());
  std::memcpy(static_cast<char*>(w13.data()) + g.nbytes(), u.data(), u.nbytes());
}

std::string tolerance_of(const QuantConfig& q, DType dtype) {
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

}  // namespace

CheckpointMoELayer::CheckpointMoELayer() = default;
CheckpointMoELayer::CheckpointMoELayer(CheckpointMoELayer&&) noexcept = default;
CheckpointMoELayer& CheckpointMoELayer::operator=(CheckpointMoELayer&&) noexcept = default;
CheckpointMoELayer::~CheckpointMoELayer() = default;

std::string CheckpointMoELayer::scheme() const {
  if (!method_) return "unquantized";
  return fmt::format("{} ({} x {})", method_->name(),
                     quant_key_to_string(method_->weight_quant_key()),
                     quant_key_to_string(method_->activation_quant_key()));
}

const QuantConfig& CheckpointMoELayer::quant_config() const {
  static const QuantConfig kUnquantized = QuantConfig::unquantized();
  return method_ ? method_->moe_quant_config() : kUnquantized;
}

std::string CheckpointMoELayer::tolerance_name() const {
  return tolerance_of(quant_config(), options_.dtype);
}

const Router& CheckpointMoELayer::router() const {
  return layer_ ? layer_->router() : *router_;
}

const OracleReport& CheckpointMoELayer::selection() const {
  return method_ ? method_->selection() : layer_->selection();
}

std::string CheckpointMoELayer::experts_name() const {
  return method_ ? method_->kernel()->fused_experts().name()
                 : layer_->kernel().fused_experts().name();
}

Tensor CheckpointMoELayer::router_logits(const Tensor& x) const {
  MOEKIT_CHECK(router_weight_.defined(),
               "layer {}: the checkpoint has no router (gate) weight to compute logits with",
               layer_index_);
  MOEKIT_CHECK(x.dim() == 2 && x.size(1) == model_.hidden_size,
               "router_logits: x {} must be (M, {})", x.describe(), model_.hidden_size);
  const int64_t M = x.size(0), H = x.size(1), E = router_weight_.size(0);
  const std::vector<float> xv = x.to_float_vector();
  const std::vector<float> wv = router_weight_.to_float_vector();
  std::vector<float> out(static_cast<size_t>(M * E));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t e = 0; e < E; ++e) {
      double s = 0.0;
      for (int64_t h = 0; h < H; ++h)
        s += static_cast<double>(xv[m * H + h]) * wv[e * H + h];
      out[m * E + e] = static_cast<float>(s);
    }
  }
  return Tensor::from_floats(out, {M, E}, DType::kF32);
}

Tensor CheckpointMoELayer::forward(const Tensor& x, const Tensor& logits) {
  if (layer_) return layer_->forward(x, logits);
  const RoutingResult routing = router_->select_experts(x, logits);
  Tensor out = method_
                   ->apply(params_, x, routing.topk_weights, routing.topk_ids,
                           router_->apply_router_weight_on_input())
                   .output;
  if (shared_) {
    const Tensor s = shared_->forward(x, RunContext{});
    for (int64_t i = 0; i < out.numel(); ++i) {
      store_float(out.data(), out.dtype(), i,
                  load_float(out.data(), out.dtype(), i) + load_float(s.data(), s.dtype(), i));
    }
  }
  return out;
}

ReferenceWeights CheckpointMoELayer::reference_weights() const {
  ReferenceWeights w;
  if (method_) {
    std::tie(w.w13, w.w2) = method_->dequantized_weights(params_);
    if (params_.has("w13_bias")) w.w13_bias = params_.get("w13_bias");
    if (params_.has("w2_bias")) w.w2_bias = params_.get("w2_bias");
  } else {
    const MoELayerWeights& lw = layer_->weights();
    w.w13 = lw.w13.to_dtype(DType::kF32);
    w.w2 = lw.w2.to_dtype(DType::kF32);
    if (lw.w13_bias.defined()) w.w13_bias = lw.w13_bias.to_dtype(DType::kF32);
    if (lw.w2_bias.defined()) w.w2_bias = lw.w2_bias.to_dtype(DType::kF32);
  }
  w.shared_w13 = shared_w13_;
  w.shared_w2 = shared_w2_;
  return w;
}

std::optional<quark::QuarkConfig> read_quark_config(const std::filesystem::path& dir) {
  const json root = read_config_json(dir);
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return std::nullopt;
  const std::string where = (dir / "config.json").string() + ": quantization_config";
  if (!it->is_object()) {
    throw Error(fmt::format("{}: expected an object, got {}", where, it->type_name()));
  }
  return quark::QuarkConfig::from_json(*it, where);
}

CheckpointMoELayer load_moe_layer(const std::filesystem::path& dir, int layer_index,
                                  const CheckpointLoadOptions& options) {
  CheckpointMoELayer out;
  out.layer_index_ = layer_index;
  out.options_ = options;
  std::optional<quark::QuarkConfig> qc = read_quark_config(dir);
  out.model_ = preset_from_hf_config(dir / "config.json");
  const ModelPreset& model = out.model_;
  MoELayerOptions lo;
  lo.dtype = options.dtype;
  lo.backend = options.backend;
  lo.max_num_tokens = options.max_num_tokens;
  out.moe_ = MoELayer::make_moe_config(model, lo);
  const MoEConfig& moe = out.moe_;

  const Reader r(dir);
  const LayerNames names = find_names(r, layer_index, model);
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const std::string router_name = names.moe_prefix + ".gate.weight";
  if (r.contains(router_name)) out.router_weight_ = read_float(r, router_name, {E, H});
  if (model.has_e_score_correction_bias) {
    out.e_score_bias_ = read_float(r, names.moe_prefix + ".gate.e_score_correction_bias", {E});
  }
  load_shared(r, layer_index, model, out.shared_w13_, out.shared_w2_);

  const std::string layer_name = names.moe_prefix + ".experts";
  if (!qc || qc->is_excluded(layer_name)) {
    MoELayerWeights w;
    load_unquantized(r, names, moe, options.dtype, w, model.has_bias);
    w.e_score_correction_bias = out.e_score_bias_;
    if (out.shared_w13_.defined()) {
      w.shared_w13 = out.shared_w13_.to_dtype(options.dtype);
      w.shared_w2 = out.shared_w2_.to_dtype(options.dtype);
    }
    out.layer_ = std::make_unique<MoELayer>(model, std::move(w), lo);
    return out;
  }

  const quark::QuarkMoETarget target = quark::get_moe_method_target(*qc, layer_name);
  out.method_ = quark::get_moe_method(*qc, moe, target);
  const auto [H2, I2] = out.method_->maybe_roundup_sizes(H, I, options.dtype, moe.parallel);
  MOEKIT_CHECK(H2 == H && I2 == I,
               "{}: hidden_size={} and intermediate_size={} must already be aligned for backend "
               "{} (needs {} and {}); padding checkpoints on load is not supported",
               out.method_->name(), H, I, out.method_->backend(), H2, I2);
  out.method_->create_weights(out.params_, E, H, I, options.dtype);
  out.params_.swiglu = SwigluParams{model.swiglu_alpha, model.swiglu_beta, model.swiglu_limit};
  for (const std::string& p : out.params_.names())
    load_param(r, names, out.params_, p, moe.w13_num_shards());
  out.method_->process_weights_after_loading(out.params_);
  out.router_ = make_router(MoELayer::make_router_config(model, out.e_score_bias_));
  if (out.shared_w13_.defined()) {
    out.shared_ = std::make_shared<CpuReferenceSharedExperts>(
        out.shared_w13_.to_dtype(options.dtype), out.shared_w2_.to_dtype(options.dtype),
        model.activation, moe.activation_params());
  }
  return out;
}

std::vector<double> reference_forward(const CheckpointMoELayer& layer, const Tensor& x,
                                      const RoutingResult& routing,
                                      const std::vector<int64_t>& rows) {
  const ReferenceWeights w = layer.reference_weights();
  const QuantConfig& q = layer.quant_config();
  const MoEConfig& moe = layer.moe_config();
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const Activation act = moe.activation;
  const int64_t N = is_gated(act) ? 2 * I : I;
  const DType dt = x.dtype();
  const int64_t k = routing.topk_ids.size(1);
  const std::vector<int64_t> ids = routing.topk_ids.to_int_vector();
  const std::vector<float> tw = routing.topk_weights.to_float_vector();
  const std::vector<float> xv = x.to_float_vector();
  const std::vector<float> w13 = w.w13.to_float_vector(), w2 = w.w2.to_float_vector();
  const std::vector<float> b13 =
      w.w13_bias.defined() ? w.w13_bias.to_float_vector() : std::vector<float>{};
  const std::vector<float> b2 =
      w.w2_bias.defined() ? w.w2_bias.to_float_vector() : std::vector<float>{};
  ActivationParams params = moe.activation_params();
  if (q.gemm1_alpha) params.alpha = *q.gemm1_alpha;
  if (q.gemm1_beta) params.beta = *q.gemm1_beta;
  if (q.gemm1_clamp_limit) params.clamp_limit = q.gemm1_clamp_limit;
  const bool on_input = layer.router().apply_router_weight_on_input();
  auto gscale = [](const QuantDesc& d, int64_t e) -> std::optional<float> {
    if (!d.alpha_or_gscale.defined()) return std::nullopt;
    const std::vector<float> g = d.alpha_or_gscale.to_float_vector();
    return g.size() > 1 ? g[static_cast<size_t>(e)] : g[0];
  };
  auto qdq = [&](std::vector<float>& v, int64_t cols, const QuantDesc& d, int64_t e) {
    if (d.dtype == QuantDType::kNone) return;
    if (auto g = gscale(d, e)) {
      quant_dequant_rows(v, 1, cols, d, *g);
    } else {
      quant_dequant_rows(v, 1, cols, d);
    }
  };
  // Pass 1: the intermediates of every (row, slot), so a per-tensor dynamic a2 sees them all.
  struct Slot {
    int64_t row, e;
    double weight;
    std::vector<float> a;
  };
  std::vector<Slot> slots;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const int64_t m = rows[ri];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * k + j)];
      if (e < 0 || e >= moe.num_local_experts) continue;
      const double wt = tw[static_cast<size_t>(m * k + j)];
      std::vector<float> h(xv.begin() + m * H, xv.begin() + (m + 1) * H);
      if (on_input) {
        for (float& v : h)
          v = round_to_dtype(static_cast<float>(v * wt), dt);
      }
      qdq(h, H, q.a1, e);
      std::vector<float> g(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        double acc = b13.empty() ? 0.0 : b13[e * N + n];
        for (int64_t c = 0; c < H; ++c)
          acc += static_cast<double>(w13[(e * N + n) * H + c]) * h[c];
        g[n] = round_to_dtype(static_cast<float>(acc), dt);
      }
      std::vector<float> a(static_cast<size_t>(I));
      apply_activation_row(act, params, g.data(), a.data(), I);
      for (float& v : a)
        v = round_to_dtype(v, dt);
      slots.push_back({static_cast<int64_t>(ri), e, on_input ? 1.0 : wt, std::move(a)});
    }
  }
  const bool a2_tensor_dynamic = q.a2.dtype != QuantDType::kNone && q.a2.shape.is_per_tensor() &&
                                 !q.a2.scale.defined() && !q.a2.alpha_or_gscale.defined();
  if (a2_tensor_dynamic && !slots.empty()) {
    std::vector<float> all;
    for (const Slot& s : slots)
      all.insert(all.end(), s.a.begin(), s.a.end());
    quant_dequant_rows(all, static_cast<int64_t>(slots.size()), I, q.a2);
    for (size_t i = 0; i < slots.size(); ++i)
      std::copy(all.begin() + static_cast<int64_t>(i) * I,
                all.begin() + static_cast<int64_t>(i + 1) * I, slots[i].a.begin());
  } else {
    for (Slot& s : slots)
      qdq(s.a, I, q.a2, s.e);
  }
  std::vector<double> out(rows.size() * static_cast<size_t>(H), 0.0);
  for (const Slot& s : slots) {
    for (int64_t c = 0; c < H; ++c) {
      double acc = b2.empty() ? 0.0 : b2[s.e * H + c];
      for (int64_t i = 0; i < I; ++i)
        acc += static_cast<double>(w2[(s.e * H + c) * I + i]) * s.a[i];
      out[s.row * H + c] += s.weight * acc;
    }
  }
  if (w.shared_w13.defined()) {
    const std::vector<float> s13 = w.shared_w13.to_float_vector();
    const std::vector<float> s2 = w.shared_w2.to_float_vector();
    const int64_t Is = w.shared_w2.size(1);
    const int64_t Ns = is_gated(act) ? 2 * Is : Is;
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const int64_t m = rows[ri];
      std::vector<float> g(static_cast<size_t>(Ns));
      for (int64_t n = 0; n < Ns; ++n) {
        double acc = 0.0;
        for (int64_t c = 0; c < H; ++c)
          acc += static_cast<double>(s13[n * H + c]) * xv[m * H + c];
        g[n] = static_cast<float>(acc);
      }
      std::vector<float> a(static_cast<size_t>(Is));
      apply_activation_row(act, params, g.data(), a.data(), Is);
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < Is; ++i)
          acc += static_cast<double>(s2[c * Is + i]) * a[i];
        out[ri * H + c] += acc;
      }
    }
  }
  return out;
}

}  // namespace moekit
