#include "moekit/oracle/fp8.h"

#include "seed_backends.h"

namespace moekit {
namespace {

// The original's fp8 backends, in its priority order; none has a moekit kernel.
const SeedBackends kSeedFp8(QuantOracleKind::kFp8,
                            {
                                {"aiter"},
                                {"flashinfer_trtllm"},
                                {"flashinfer_cutlass"},
                                {"deep_gemm", {"deepgemm"}, "batched_deep_gemm"},
                                {"vllm_cutlass", {}, "batched_vllm_cutlass"},
                                {"triton", {}, "batched_triton"},
                                {"marlin", {}, "", {.weight_only = true}},
                                {"batched_deep_gemm"},
                                {"batched_vllm_cutlass"},
                                {"batched_triton"},
                                {"xpu"},
                            });

}  // namespace

std::vector<QuantScheme> fp8_w8a8_schemes() {
  namespace qk = quant_keys;
  return {
      {qk::kFp8Static128BlockSym, qk::kFp8Dynamic128Sym},
      {qk::kFp8Static128BlockE8M0Sym, qk::kFp8Dynamic128Sym},
      {qk::kFp8StaticTensorSym, qk::kFp8StaticTensorSym},
      {qk::kFp8StaticTensorSym, qk::kFp8DynamicTensorSym},
      {qk::kFp8StaticTensorSym, qk::kFp8DynamicTokenSym},
      {qk::kFp8StaticChannelSym, qk::kFp8DynamicTokenSym},
      {qk::kFp8StaticChannelSym, qk::kFp8StaticTensorSym},
      {qk::kFp8StaticChannelSym, qk::kFp8DynamicTensorSym},
  };
}

std::optional<int> Fp8MoEKernelOracle::priority_for(const ExpertsBackend& backend,
                                                    const MoEConfig& moe_config) const {
  if (!allow_vllm_cutlass_ &&
      (backend.name == "vllm_cutlass" || backend.name == "batched_vllm_cutlass")) {
    return std::nullopt;
  }
  const bool block = weight_key() == quant_keys::kFp8Static128BlockSym ||
                     weight_key() == quant_keys::kFp8Static128BlockE8M0Sym;
  if (moe_config.device.type == DeviceType::kCUDA && moe_config.device.compute_capability == 90 &&
      block) {
    // The original moves this backend to the front of its own list.
    const char* first = moe_config.parallel.use_ep ? "flashinfer_cutlass" : "triton";
    if (backend.name == first) return kPrioritySeedDeclared - 1;
  }
  return backend.priority;
}

QuantConfig Fp8MoEKernelOracle::make_quant_config(const ExpertsBackend& backend,
                                                  const MoEWeightShape& shape,
                                                  Fp8W8A8Params params) {
  if (backend.traits.weight_only) {
    params.a1_scale = Tensor{};
    params.a2_scale = Tensor{};
    params.per_act_token_quant = false;
    return fp8_w8a16_moe_quant_config(shape, params);
  }
  return fp8_w8a8_moe_quant_config(shape, params);
}

}  // namespace moekit
