// Quark MoE methods: choose the method of a routed-experts layer from its Quark config (the seed's
// QuarkMoEMethod.get_moe_method_target / get_moe_method), declare its parameters, turn loaded
// checkpoint tensors into kernel format and run them through the oracle's kernel.
//
// Life of a layer (what the checkpoint loader does, layer/checkpoint.h):
//   auto target = get_moe_method_target(config, "model.layers.3.mlp.experts");
//   auto method = get_moe_method(config, moe, target);
//   auto [H, I] = method->maybe_roundup_sizes(H0, I0, dtype, moe.parallel);
//   ExpertParams layer;
//   method->create_weights(layer, E, H, I, dtype);   // names, shapes, dtypes (table below)
//   layer.load("w13_weight", tensor, "checkpoint name");  // validated against the spec
//   method->process_weights_after_loading(layer);     // checks scales, kernel format, QuantConfig
//   MoEOutput y = method->apply(layer, x, topk_weights, topk_ids);
//
// Parameters (E experts, H hidden, I intermediate per partition, N1 = 2I gated / I otherwise;
// Hp / Ip = packed row bytes of H / I: fp4 and int4 ceil(x/2), fp6 3x/4):
// | method                 | w13_weight       | w13_weight_scale        | others |
// |------------------------|------------------|-------------------------|--------------------------|
// | QuarkW8A8Fp8MoEMethod  | (E,N1,H) fp8     | tensor (E,2) / channel  | static act: w13/w2_ | |
// |                  | (E,N1,1) / block f32 or | input_scale (E,) f32     | | |                  |
// e8m0 (E,ceil(N1/128),   |                          | |                        | | ceil(H/128)) |
// | | QuarkW8A8Int8MoEMethod | (E,N1,H) int8    | tensor (E,2) / channel  | static act: input_scale
// | |                        |                  | (E,N1,1) f32            | (E,) f32 | |
// QuarkW4A8Fp8MoEMethod  | (E,N1,Hp) u8     | int4 per channel        | w13_weight_scale_2 (E,2) |
// |                        | signed int4, low | (E,N1,1) f32            | fp8 per-tensor f32; | |
// | nibble first     |                         | static act: input_scale  | | QuarkNvfp4MoEMethod
// | (E,N1,Hp) u8     | (E,N1,H/16) fp8 e4m3    | w13_weight_scale_2 (E,2),| | |                  |
// | w13_input_scale_2 (E,2)  | | QuarkOCP_MX_MoEMethod  | (E,N1,Hp) u8     | (E,N1,H/32) u8 (e8m0)
// | static fp8 act:          | |                        |                  | | input_scale (E,) f32
// | w2 counterparts: w2_weight (E,H,I or Ip), w2_weight_scale (E,) / (E,H,1) / (E,H,I/g) / blocks,
// w2_weight_scale_2 (E,), w2_input_scale(_2) (E,). Biases (MoEConfig::has_bias): w13_bias (E,N1)
// f32, w2_bias (E,H) f32. Per-tensor scales hold one value per fused shard
// ((E,2): w1, w3); the loader stacks gate rows then up rows.
//
// process_weights_after_loading (every method): every scale must be finite and > 0 (e8m0 /
// ue4m3 codes: not NaN; ue4m3: no sign bit), else moekit::Error naming the parameter, the expert
// and the value. Then:
//   - fp8 / int8 per tensor: w13 gets one scale per expert, the max of the w1 and w3 scales,
//     and the shard with the smaller scale is dequantized and re-quantized with it (the seed);
//     static input scales (E,) are reduced to their max (warning when they differ).
//   - W4A8: the per-tensor fp8 scale is folded into the int4 per-channel scale; int4 codes are
//     rebiased to uint4b8 (q + 8), the layout of the W4A8 experts.
//   - NVFP4: warns once "w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be
//     affected." when the two shards' global scales differ, then uses the w1 column; block scales
//     become kUE4M3.
//   - OCP MX: scales become kUE8M0; weights stay packed.
// then get_fused_moe_quant_config (quant_factories.h) with the chosen backend's traits.
//
// Backends: each method plans once at construction with its oracle (fp8, int8, w4a8, nvfp4,
// mxfp4); every oracle lists its CPU emulation backend last, so a CPU deployment always has one.
// What a backend needs (size alignment, weight-only activations, per-expert global scales) is
// read from its registration's traits, never from its name.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/config/quant_factories.h"
#include "moekit/config/quant_key.h"
#include "moekit/core/tensor.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/plan.h"
#include "moekit/quantization/quark/quark_config.h"

namespace moekit::quark {

// The expected shape and dtype of one parameter.
struct ParamSpec {
  Shape shape;
  DType dtype = DType::kF32;
};

// The parameters of one routed-experts layer (the seed's module attributes), by name.
class ExpertParams {
 public:
  // Allocates a CPU parameter of this spec filled with `init` (0 or 1, as the seed's
  // torch.zeros / torch.ones); replaces an existing one of the same name.
  Tensor& register_parameter(const std::string& name, Shape shape, DType dtype, double init = 0.0);
  bool has(std::string_view name) const;
  // Throws moekit::Error naming the parameter when absent.
  const Tensor& get(std::string_view name) const;
  // The parameter, or an undefined Tensor when absent.
  Tensor get_or_none(std::string_view name) const;
  const ParamSpec& spec(std::string_view name) const;
  // Copies `value` into the parameter. Throws moekit::Error naming `source` (the checkpoint
  // tensor, default the parameter) when the shape or dtype differs from the spec (a shape that
  // differs only by trailing 1s is accepted, numel equal).
  void load(std::string_view name, const Tensor& value, std::string_view source = {});
  // Swaps in a kernel-format tensor (the seed's replace_parameter); the spec follows it.
  void replace(std::string_view name, Tensor value);
  void erase(std::string_view name);
  std::vector<std::string> names() const;

  // gpt-oss swiglu parameters of the layer (the seed's layer.swiglu_*).
  SwigluParams swiglu;
  // false: register_parameter leaves parameters of init 0 uninitialized, for a caller that
  // writes every one (fill_random_parameters; a deepseek-v3 layer is 11 GB of codes).
  bool zero_fill = true;

 private:
  struct Entry {
    ParamSpec spec;
    Tensor tensor;
  };
  std::map<std::string, Entry, std::less<>> params_;
};

enum class QuarkMoEScheme { kW8A8Fp8, kW4A8Fp8, kNvfp4, kOcpMx, kW8A8Int8 };
// The method class names: "QuarkW8A8Fp8MoEMethod", "QuarkW4A8Fp8MoEMethod",
// "QuarkNvfp4MoEMethod", "QuarkOCP_MX_MoEMethod", "QuarkW8A8Int8MoEMethod".
std::string_view quark_moe_method_name(QuarkMoEScheme scheme);

struct QuarkMoETarget {
  std::optional<QuantKey> weight_key;
  std::optional<QuantKey> activation_key;
  QuarkMoEScheme scheme = QuarkMoEScheme::kW8A8Fp8;
};

// The seed's get_moe_method_target for `layer_name` (e.g. "model.layers.3.mlp.experts"):
//   - quantized output_tensors or bias: UnsupportedError "Currently, Quark models with
//     output_tensors and bias quantized are not supported";
//   - a weight or input hint with two entries: fp8 W4A8, then NVFP4, else UnsupportedError
//     "Unsupported FusedMoe scheme ...";
//   - single specs: fp8 W8A8, then OCP MX (static fp8 activations allowed), then int8 W8A8, else
//     UnsupportedError "Unsupported FusedMoe scheme ...".
QuarkMoETarget get_moe_method_target(const QuarkConfig& config, std::string_view layer_name,
                                     std::string_view layer_type = "FusedMoE");

class QuarkMoEMethod {
 public:
  virtual ~QuarkMoEMethod();
  QuarkMoEMethod(const QuarkMoEMethod&) = delete;
  QuarkMoEMethod& operator=(const QuarkMoEMethod&) = delete;

  virtual std::string name() const = 0;
  const MoEConfig& moe() const { return moe_; }
  const std::optional<QuantKey>& weight_quant_key() const { return weight_key_; }
  const std::optional<QuantKey>& activation_quant_key() const { return activation_key_; }
  bool has_bias() const { return moe_.has_bias; }

  // The sizes the parameters are created with; the base returns them unchanged.
  virtual std::pair<int64_t, int64_t> maybe_roundup_sizes(int64_t hidden_size,
                                                          int64_t intermediate_size_per_partition,
                                                          DType act_dtype,
                                                          const ParallelConfig& parallel) const;
  // Registers the parameters (table in the file comment) on `layer`.
  virtual void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                              int64_t intermediate_size_per_partition,
                              DType params_dtype) const = 0;
  // Checks the loaded scales, converts to kernel format and builds the kernel.
  virtual void process_weights_after_loading(ExpertParams& layer) = 0;
  // The QuantConfig of the processed parameters (quant_factories.h).
  virtual QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const = 0;
  // (E, N1, H) and (E, H, I) f32 weights decoded from the processed parameters with the number
  // formats directly (not through the kernel): what a float64 check recomputes with.
  virtual std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const = 0;
  virtual bool supports_eplb() const { return false; }

  // Whether the chosen experts class routes itself (then use apply_monolithic).
  bool is_monolithic() const;
  // x (M, H) in the activation dtype, topk_weights (M, k) f32, topk_ids (M, k) int32 -> output.
  // Needs process_weights_after_loading first.
  MoEOutput apply(const ExpertParams& layer, const Tensor& x, const Tensor& topk_weights,
                  const Tensor& topk_ids, bool apply_router_weight_on_input = false,
                  RunContext ctx = {}) const;
  // Monolithic kernels route themselves: router_logits (M, E). Throws for a modular kernel.
  Tensor apply_monolithic(const ExpertParams& layer, const Tensor& x, const Tensor& router_logits,
                          RunContext ctx = {}) const;

  // The method's kernel, built from its plan on first use (after process_weights_after_loading).
  // The checkpoint loader does not use it: it builds a MoELayer from the same plan instead.
  FusedMoEKernel* kernel() const;
  // The QuantConfig of the processed parameters (set by process_weights_after_loading).
  const QuantConfig& moe_quant_config() const { return quant_; }
  // The decision, made once at construction through the scheme's oracle (the seed selects in the
  // method's constructor): the experts, prepare/finalize and weight layout, every reason.
  const MoEPlan& plan() const { return plan_; }
  QuantOracleKind oracle_kind() const { return oracle_kind_; }
  // The oracle's decision table, and the chosen backend's name ("" when none could be chosen).
  const OracleReport& selection() const { return plan_.experts_report; }
  std::string backend() const;
  // The chosen backend's record; throws UnsupportedError with every reason when none was chosen.
  const ExpertsBackend& chosen_backend() const;

 protected:
  // Throws moekit::Error "Unsupported activation quant key: ..." / "Unsupported weight quant
  // key: ..." when the keys are not in the method's lists (the seed's base class).
  QuarkMoEMethod(MoEConfig moe, std::optional<QuantKey> weight_key,
                 std::optional<QuantKey> activation_key,
                 const std::vector<std::optional<QuantKey>>& supported_activation_keys,
                 const std::vector<QuantKey>& supported_weight_keys);
  // Plans the layer with the oracle of `kind` (once, from the constructor).
  void select_backend(QuantOracleKind kind);
  // The end of process_weights_after_loading: the QuantConfig of the processed parameters.
  void finish_loading(const ExpertParams& layer);

  MoEConfig moe_;
  std::optional<QuantKey> weight_key_;
  std::optional<QuantKey> activation_key_;
  QuantConfig quant_;
  QuantOracleKind oracle_kind_ = QuantOracleKind::kUnquantized;
  MoEPlan plan_;
  bool loaded_ = false;
  mutable std::unique_ptr<FusedMoEKernel> kernel_;
};

// fp8 W8A8: per tensor (static or dynamic per-tensor activations), per channel (dynamic per-token
// activations), 128x128 blocks (dynamic (1,128) activation groups).
class QuarkW8A8Fp8MoEMethod final : public QuarkMoEMethod {
 public:
  // Throws moekit::Error for a per-tensor / per-channel mix the seed rejects.
  QuarkW8A8Fp8MoEMethod(MoEConfig moe, QuantKey weight_key, std::optional<QuantKey> act_key);
  std::string name() const override { return "QuarkW8A8Fp8MoEMethod"; }
  void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype) const override;
  void process_weights_after_loading(ExpertParams& layer) override;
  QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const override;
  std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const override;
  bool supports_eplb() const override { return true; }
  bool static_input_scales() const { return static_input_scales_; }

 private:
  enum class Granularity { kTensor, kChannel, kBlock };
  Granularity granularity_;
  bool static_input_scales_;
};

// int8 W8A8: per-tensor or per-channel weights; static per-tensor or dynamic per-tensor / per-token
// activations (symmetric only).
class QuarkW8A8Int8MoEMethod final : public QuarkMoEMethod {
 public:
  QuarkW8A8Int8MoEMethod(MoEConfig moe, QuantKey weight_key, std::optional<QuantKey> act_key);
  std::string name() const override { return "QuarkW8A8Int8MoEMethod"; }
  void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype) const override;
  void process_weights_after_loading(ExpertParams& layer) override;
  QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const override;
  std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const override;

 private:
  bool per_channel_;
  bool static_input_scales_;
};

// fp8 W4A8: int4 weights (signed nibbles, low first), fp8 activations (dynamic per-token or static
// per-tensor). Per channel (weight key kInt4W4A8StaticChannelSym: Quark's W4A8, int4 per channel
// under an fp8 per-tensor weight_scale_2, folded at load) or with a scale per output channel and
// kGroupSize of K (kInt4W4A8StaticGroup128Sym: weight_scale (E, N, ceil(K / 128)), no second
// stage; the Quark form of compressed-tensors' W4AFP8, quark_config.h's is_int4_group_w4a8).
class QuarkW4A8Fp8MoEMethod final : public QuarkMoEMethod {
 public:
  static constexpr int64_t kGroupSize = 128;
  QuarkW4A8Fp8MoEMethod(MoEConfig moe, QuantKey weight_key, std::optional<QuantKey> act_key);
  std::string name() const override { return "QuarkW4A8Fp8MoEMethod"; }
  void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype) const override;
  void process_weights_after_loading(ExpertParams& layer) override;
  QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const override;
  std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const override;
  bool grouped() const { return group_size_ > 0; }

 private:
  bool static_input_scales_;
  int64_t group_size_;  // -1: per channel; kGroupSize
};

// NVFP4: fp4 e2m1 weights in groups of 16 with fp8 e4m3 block scales and fp32 global scales;
// nvfp4 activations with static global scales.
class QuarkNvfp4MoEMethod final : public QuarkMoEMethod {
 public:
  static constexpr int64_t kGroupSize = 16;
  QuarkNvfp4MoEMethod(MoEConfig moe, std::optional<QuantKey> act_key);
  std::string name() const override { return "QuarkNvfp4MoEMethod"; }
  void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype) const override;
  void process_weights_after_loading(ExpertParams& layer) override;
  QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const override;
  std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const override;
  bool supports_eplb() const override { return true; }
};

// OCP MX: mxfp4 / mxfp6 weights (e8m0 scales per 32), activations none, dynamic OCP MX or static
// fp8. ocp_mx_scheme() is one of the seed's OCP_MX_Scheme members, e.g. "w_mxfp4_a_fp8".
class QuarkOcpMxMoEMethod final : public QuarkMoEMethod {
 public:
  static constexpr int64_t kBlockSize = 32;
  // Throws moekit::Error for a dtype pair with no OCP_MX_Scheme, UnsupportedError for static
  // scales with MX activations or dynamic scales with fp8 activations.
  QuarkOcpMxMoEMethod(MoEConfig moe, QuantKey weight_key, std::optional<QuantKey> act_key);
  std::string name() const override { return "QuarkOCP_MX_MoEMethod"; }
  std::pair<int64_t, int64_t> maybe_roundup_sizes(int64_t hidden_size,
                                                  int64_t intermediate_size_per_partition,
                                                  DType act_dtype,
                                                  const ParallelConfig& parallel) const override;
  void create_weights(ExpertParams& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype) const override;
  void process_weights_after_loading(ExpertParams& layer) override;
  // UnsupportedError for w_mxfp6_e3m2_a_fp8 / w_mxfp6_e2m3_a_fp8 (no fused MoE quant config).
  QuantConfig get_fused_moe_quant_config(const ExpertParams& layer) const override;
  std::pair<Tensor, Tensor> dequantized_weights(const ExpertParams& layer) const override;
  bool supports_eplb() const override { return true; }

  const std::string& ocp_mx_scheme() const { return scheme_; }
  const std::string& weight_dtype() const { return weight_dtype_; }  // "mxfp4", "mxfp6_e3m2", ..
  // "fp8", "mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", or nullopt (weight-only).
  const std::optional<std::string>& input_dtype() const { return input_dtype_; }
  bool static_input_scales() const { return static_input_scales_; }

 private:
  std::string weight_dtype_;
  std::optional<std::string> input_dtype_;
  std::string scheme_;
  bool static_input_scales_;
};

// Fills the parameters create_weights registered with random valid values, so that a layer of a
// real model's shape can be built without a checkpoint (benchmarks): codes uniform over the
// format's finite codes, scales such that the dequantized weights are about 2/sqrt(K) in
// magnitude (K = hidden for w13, intermediate for w2), static input scales for inputs of about 1
// (GEMM1) and 4 (GEMM2), biases in [-0.1, 0.1]. Deterministic in `seed`.
void fill_random_parameters(ExpertParams& layer, const QuarkMoEMethod& method, int64_t hidden,
                            int64_t intermediate, uint64_t seed);

// The seed's get_moe_method: the method of `target` for `moe`. Throws UnsupportedError
// "Unsupported FusedMoe scheme" when the target has no weight key.
std::unique_ptr<QuarkMoEMethod> get_moe_method(const QuarkConfig& config, const MoEConfig& moe,
                                               const QuarkMoETarget& target);

// The OCP_MX_Scheme member of an (input, weight) dtype pair, e.g. (nullopt, "mxfp4") ->
// "w_mxfp4", ("fp8", "mxfp6_e3m2") -> "w_mxfp6_e3m2_a_fp8"; nullopt for pairs it lacks.
std::optional<std::string> ocp_mx_scheme_from_quant_dtype(const std::optional<std::string>& input,
                                                          const std::string& weight);

}  // namespace moekit::quark
