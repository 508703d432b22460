// Loading one MoE layer from a HuggingFace-layout checkpoint directory: config.json (model shape
// and quantization_config) plus *.safetensors (optionally sharded with
// model.safetensors.index.json).
//
//   CheckpointMoELayer layer = load_moe_layer("ckpt/", 1);
//   Tensor logits = layer.router_logits(x);           // x (M, H) @ gate.weight^T, f32
//   Tensor y = layer.forward(x, logits);               // (M, H)
//
// Tensor names (N = layer index, E = expert index), tried in this order:
//   experts   model.layers.N.mlp.experts.E.{gate,up,down}_proj.<param>          (Qwen, DeepSeek)
//             model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.<param>     (Mixtral)
//   router    <moe prefix>.gate.weight (E, H); DeepSeek's <moe prefix>.gate.e_score_correction_bias
//   shared    model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight (DeepSeek),
//             model.layers.N.mlp.shared_expert.{...} (Qwen2-MoE), unquantized
// <param> is "weight" plus, per quantization method, the suffix of each parameter the method
// declares (quark_moe.h): w13_weight_scale <- gate/up "weight_scale", w2_input_scale <- down
// "input_scale", w13_bias <- gate/up "bias", ... Per expert the gate rows come first, then the up
// rows (w13 = [gate; up]); per-tensor parameters hold one entry per shard ((E, 2): gate, up), and
// static input scales (E,) take the max of gate's and up's.
//
// Quantization: no quantization_config -> unquantized (the weights load into a MoELayer in
// options.dtype); quant_method "quark" -> the Quark MoE method of the layer (quark_moe.h), unless
// the layer is excluded; any other quant_method is an error naming it.
//
// Every failure throws moekit::Error (or io::SafetensorsError from the reader) naming the file,
// the JSON key or the tensor: a missing expert tensor names the first missing name; a wrong shape
// or dtype names the tensor, what it holds and what the layer needs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/presets.h"
#include "moekit/oracle/oracle.h"
#include "moekit/quantization/quark/quark_moe.h"
#include "moekit/router/router.h"

namespace moekit {

struct CheckpointLoadOptions {
  DType dtype = DType::kBF16;     // activation dtype (and the dtype of unquantized weights)
  std::string backend = "auto";   // force an experts backend by name
  int64_t max_num_tokens = 8192;  // per forward
};

// Float copies of a loaded layer's weights, for recomputation: the quantized weights decoded
// with the number formats (quark_moe.h dequantized_weights), unquantized ones converted to f32.
struct ReferenceWeights {
  Tensor w13;         // (E, N1, H) f32
  Tensor w2;          // (E, H, I) f32
  Tensor w13_bias;    // (E, N1) f32, optional
  Tensor w2_bias;     // (E, H) f32, optional
  Tensor shared_w13;  // (N_s, H) f32, optional
  Tensor shared_w2;   // (H, I_s) f32, optional
};

// One loaded MoE layer: an unquantized MoELayer, or a Quark method with its parameters, a router
// and optional (unquantized) shared experts.
class CheckpointMoELayer {
 public:
  CheckpointMoELayer();
  CheckpointMoELayer(CheckpointMoELayer&&) noexcept;
  CheckpointMoELayer& operator=(CheckpointMoELayer&&) noexcept;
  ~CheckpointMoELayer();

  const ModelPreset& model() const { return model_; }
  const MoEConfig& moe_config() const { return moe_; }
  int layer_index() const { return layer_index_; }
  bool is_quantized() const { return method_ != nullptr; }
  // "unquantized" or e.g. "QuarkW8A8Fp8MoEMethod (QuantKey(...) x QuantKey(...))".
  std::string scheme() const;
  // The tolerance-table entry a check of this layer uses ("bf16", "fp8_w8a8", "mxfp4", ...).
  std::string tolerance_name() const;
  // The QuantConfig the kernel runs with (QuantConfig::unquantized() for unquantized layers).
  const QuantConfig& quant_config() const;
  const Router& router() const;
  const Tensor& router_weight() const { return router_weight_; }  // (E, H) f32 or undefined
  const Tensor& e_score_correction_bias() const { return e_score_bias_; }
  const OracleReport& selection() const;
  std::string experts_name() const;
  MoELayer* unquantized_layer() const { return layer_.get(); }
  quark::QuarkMoEMethod* quark_method() const { return method_.get(); }
  const quark::ExpertParams& quark_params() const { return params_; }
  bool has_shared_experts() const { return shared_w13_.defined(); }

  // x (M, H) -> logits (M, E) f32 computed with the checkpoint's router weight (in double).
  // Throws when the checkpoint has no router weight.
  Tensor router_logits(const Tensor& x) const;
  // x (M, H) in options.dtype, router_logits (M, E) -> (M, H) (shared experts added).
  Tensor forward(const Tensor& x, const Tensor& router_logits);
  ReferenceWeights reference_weights() const;

 private:
  friend CheckpointMoELayer load_moe_layer(const std::filesystem::path& dir, int layer_index,
                                           const CheckpointLoadOptions& options);
  ModelPreset model_;
  MoEConfig moe_;
  int layer_index_ = 0;
  CheckpointLoadOptions options_;
  std::unique_ptr<MoELayer> layer_;                // unquantized
  std::unique_ptr<quark::QuarkMoEMethod> method_;  // quantized
  quark::ExpertParams params_;                     // quantized
  std::unique_ptr<Router> router_;                 // quantized (MoELayer has its own)
  std::shared_ptr<SharedExperts> shared_;          // quantized layers' shared experts
  Tensor shared_w13_, shared_w2_;                  // f32 copies (reference)
  Tensor router_weight_;
  Tensor e_score_bias_;
};

// Loads MoE layer `layer_index` of the checkpoint in `dir`. Throws moekit::Error naming the
// file, key or tensor on any problem (see the file comment).
CheckpointMoELayer load_moe_layer(const std::filesystem::path& dir, int layer_index,
                                  const CheckpointLoadOptions& options = {});

// The Quark config of a checkpoint (nullopt when config.json has no quantization_config).
// Throws moekit::Error for unreadable / malformed config.json or a non-Quark quant_method.
std::optional<quark::QuarkConfig> read_quark_config(const std::filesystem::path& dir);

// A float64 recomputation of rows `rows` of layer.forward(x, .) with the given routing: the
// weights of reference_weights(), x and the intermediate quantize-dequantized as the layer's
// QuantConfig says (activation quantization being part of the scheme; a dynamic per-tensor scale
// of the intermediate is taken over the sampled rows only), intermediate rounded to x's dtype.
// Returns (rows.size(), H) row-major.
std::vector<double> reference_forward(const CheckpointMoELayer& layer, const Tensor& x,
                                      const RoutingResult& routing,
                                      const std::vector<int64_t>& rows);

}  // namespace moekit
