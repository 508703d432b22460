// CPU emulation experts for the quantized schemes: they compute what the real (GPU) kernels
// compute, on the CPU, so GPU results can be compared with them and quantized layers run anywhere.
//
// Numerics (CpuReferenceExperts' rounding points plus the quantization steps):
//   1. h = the input row, as the scheme delivers it to GEMM1:
//        - unquantized activations (w*a16 schemes): the bf16/f16/f32 row;
//        - quantized in prepare (expects_unquantized_inputs() == false): the a1q codes and
//          a1q_scale dequantized (quant/moe_input_quant.h layout);
//        - deferred (expects_unquantized_inputs() == true, as the original's emulation classes):
//          the row quantize-dequantized here per quant_config().a1 (NVFP4 with per-expert global
//          scales: each (token, expert) row with its expert's scale).
//   2. g = W1deq[e] @ h (+ b1[e]): weights dequantized from their codes (w1 / w2 tensors) and the
//      scales of quant_config().w1 / w2 (quant/quantize.h, exact), fp32 accumulation; rounded to
//      the activation dtype.
//   3. a = act(g) in fp32 (gemm1 alpha / beta / clamp limit from the QuantConfig, else from the
//      MoEConfig), rounded to the activation dtype.
//   4. where the scheme re-quantizes the intermediate (quant_config().a2 quantized): a is
//      quantize-dequantized per a2 — a per-tensor dynamic scale spans all (token, expert) rows of
//      the call, static scales come from a2.scale, NVFP4 uses a2's global scale (per expert when
//      (E,)).
//   5. y = W2deq[e] @ a (+ b2[e]), fp32 accumulation, rounded once to the output dtype.
// The activation dtype is the dtype of the experts' output (the workspace dtype).
//
// Weight codes (see config/quant_factories.h): w1 (E, N, Kc), w2 (E, K, Dc) where Kc / Dc are the
// packed row bytes of the format (fp8 / int8: K; fp4 / int4: ceil(K/2); fp6: 3*ceil(K/4)). Sub-byte
// codes may also be given unpacked, one code per byte (last dim K), the layout the kernel's shape
// checks accept today; a last dim equal to both is read as packed.
//
// Standard activation format only; apply writes output (M, topk, K) unweighted (the prepare /
// finalize weights and reduces: Contiguous), slots with id -1, out of range or not local written
// as zeros. Every class checks at construction that its QuantConfig's (weight, activation) keys
// are among its capability record's quant_schemes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "moekit/modular/experts.h"

namespace moekit {

// The shared engine of the emulation classes below (not constructible on its own).
class CpuEmulationExperts : public ExpertsModular {
 public:
  // (E, M, N, K, topk) with K = w2.size(1) (hidden_states may hold packed codes).
  ProblemSize moe_problem_size(const Tensor& a1, const Tensor& w1, const Tensor& w2,
                               const Tensor& topk_ids) const override;
  // ws13 (M*topk, max(N, K)), ws2 (M*topk, N/2 gated or N), output (M, topk, K).
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;

 protected:
  // Throws UnsupportedError "<class>: kernel does not support quantization scheme <w>x<a>" when
  // the QuantConfig's keys are not in klass's quant_schemes.
  CpuEmulationExperts(const ExpertsClass& klass, const MoEConfig& moe, const QuantConfig& quant,
                      std::optional<int64_t> max_num_tokens, std::optional<int> num_dispatchers);
};

// fp8 W8A8 (per-tensor, per-token x per-channel, 128-block; activations quantized in prepare) and
// fp8 W8A16. Schemes: (Fp8StaticTensor, Fp8StaticTensor | Fp8DynamicTensor | Fp8DynamicToken),
// (Fp8StaticChannel, Fp8DynamicToken | Fp8StaticTensor | Fp8DynamicTensor),
// (Fp8Static128Block[E8M0], Fp8Dynamic128), (any of those weights, None).
class CpuFp8Experts final : public CpuEmulationExperts {
 public:
  CpuFp8Experts(const MoEConfig& moe, const QuantConfig& quant,
                std::optional<int64_t> max_num_tokens = std::nullopt,
                std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// int8 W8A8 (activations quantized in prepare). Schemes: (Int8StaticChannel, Int8DynamicToken |
// Int8StaticTensor | Int8DynamicTensor), (Int8StaticTensor, Int8DynamicTensor | Int8StaticTensor |
// Int8DynamicToken).
class CpuInt8Experts final : public CpuEmulationExperts {
 public:
  CpuInt8Experts(const MoEConfig& moe, const QuantConfig& quant,
                 std::optional<int64_t> max_num_tokens = std::nullopt,
                 std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// int4 / int8 weight-only (GPTQ / AWQ style, zero points optional). Schemes: (Int4Static,
// None), (Int4StaticAsym, None), (Int4Static32, None), (Int4Static32Asym, None), (Int8Static,
// None), (int8_static_asym_key(), None).
class CpuWna16Experts final : public CpuEmulationExperts {
 public:
  CpuWna16Experts(const MoEConfig& moe, const QuantConfig& quant,
                  std::optional<int64_t> max_num_tokens = std::nullopt,
                  std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// mxfp4 weights (activations quantized in prepare). Schemes: (Mxfp4Static, None),
// (Mxfp4Static, Fp8StaticTensor), (Mxfp4Static, Mxfp8Dynamic), (Mxfp4Static, Mxfp4Dynamic).
class CpuMxfp4Experts final : public CpuEmulationExperts {
 public:
  CpuMxfp4Experts(const MoEConfig& moe, const QuantConfig& quant,
                  std::optional<int64_t> max_num_tokens = std::nullopt,
                  std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// OCP MX emulation (expects unquantized inputs: activations are quantize-dequantized inside, as
// the original's OCP MX emulation). Schemes: (Mxfp4Static, Mxfp4Dynamic | Mxfp6E3M2Dynamic |
// Mxfp6E2M3Dynamic | Fp8StaticTensor | None), (Mxfp6E3M2Static, Mxfp6E3M2Dynamic |
// Fp8StaticTensor), (Mxfp6E2M3Static, Mxfp6E2M3Dynamic | Fp8StaticTensor).
class CpuOcpMxExperts final : public CpuEmulationExperts {
 public:
  CpuOcpMxExperts(const MoEConfig& moe, const QuantConfig& quant,
                  std::optional<int64_t> max_num_tokens = std::nullopt,
                  std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// NVFP4 emulation (expects unquantized inputs; quantizes with the global scale of each expert,
// as the original's NVFP4 emulation and CUTLASS FP4 experts do). Schemes: (Nvfp4Static,
// Nvfp4Dynamic), (Nvfp4Static, None).
class CpuNvfp4Experts final : public CpuEmulationExperts {
 public:
  CpuNvfp4Experts(const MoEConfig& moe, const QuantConfig& quant,
                  std::optional<int64_t> max_num_tokens = std::nullopt,
                  std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// W4A8: int4 weights with f32 per-channel or group-128 scales, fp8 activations (quantized in
// prepare). Schemes: (Int4W4A8StaticChannelSym | Int4W4A8StaticGroup128Sym,
// Fp8DynamicToken | Fp8StaticTensor).
class CpuW4A8Experts final : public CpuEmulationExperts {
 public:
  CpuW4A8Experts(const MoEConfig& moe, const QuantConfig& quant,
                 std::optional<int64_t> max_num_tokens = std::nullopt,
                 std::optional<int> num_dispatchers = std::nullopt);
  static const ExpertsClass& klass();
};

// The BatchedExperts-format twin of an emulation class (fp8, int8, mxfp4: the ones whose inputs
// are quantized in prepare, or not at all): hidden_states (E_local, T, K) codes with their scales
// (E_local, T, G) or a per-tensor (1,), per-expert token counts in ExpertTokensMetadata; the same
// engine over the flattened rows (row r of expert e computed when r < count_e, zeros after), the
// output (E_local, T, K) unweighted (finalize: Delegate, the prepare/finalize's combine weights).
// Needs max_num_tokens and num_dispatchers. The low-latency prepare/finalize with quantized
// dispatch runs on these.
class CpuBatchedEmulationExperts final : public CpuEmulationExperts {
 public:
  CpuBatchedEmulationExperts(const ExpertsClass& klass, const MoEConfig& moe,
                             const QuantConfig& quant, std::optional<int64_t> max_num_tokens,
                             std::optional<int> num_dispatchers);
  // "CpuBatchedFp8Experts", "CpuBatchedInt8Experts", "CpuBatchedMxfp4Experts": the schemes of
  // CpuFp8Experts, CpuInt8Experts, CpuMxfp4Experts in the batched format.
  static const ExpertsClass& fp8_klass();
  static const ExpertsClass& int8_klass();
  static const ExpertsClass& mxfp4_klass();

  // (E, T, N, K, topk) with K = w2.size(1) and hidden_states (E, T, K codes).
  ProblemSize moe_problem_size(const Tensor& a1, const Tensor& w1, const Tensor& w2,
                               const Tensor& topk_ids) const override;
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;
};

// The dequantized (rows, cols) fp32 values of expert e's weight codes `w` ((E, rows, Kc), see
// above; or just expert e's (rows, Kc)) under `desc` (quant_config().w1 or w2). `a_desc` is the
// matching activation descriptor (a1 for w1, a2 for w2): NVFP4 derives the weight's global scale
// from the g-alphas and the activation global scale. Used by the experts and by tests' float64
// recomputations.
std::vector<float> dequantize_expert_weight(const Tensor& w, const QuantDesc& desc,
                                            const QuantDesc& a_desc, int64_t e, int64_t cols);

}  // namespace moekit
