#include "moekit/oracle/mxfp4.h"

#include "seed_backends.h"

namespace moekit {
namespace {

constexpr BackendTraits aligned(int64_t hidden, int64_t intermediate) {
  BackendTraits t;
  t.hidden_align = hidden;
  t.intermediate_align = intermediate;
  return t;
}

const SeedBackends kSeedMxfp4(
    QuantOracleKind::kMxfp4,
    {
        {"flashinfer_trtllm_mxfp4_bf16", {"flashinfer_trtllm"}, "", aligned(256, 256)},
        {"ck", {"aiter"}, "", aligned(256, 256)},
        {"triton", {}, "", aligned(32, 64)},
        {"flashinfer_cutlass_mxfp4_bf16", {"flashinfer_cutlass"}, "", aligned(128, 128)},
        {"triton_unfused", {}, "", aligned(32, 64)},
        {"marlin", {}, "batched_marlin", aligned(256, 128)},
        {"batched_marlin", {}, "", aligned(256, 128)},
        {"xpu", {}, "", aligned(32, 64)},
        {"flashinfer_trtllm_mxfp4_mxfp8",
         {"flashinfer_trtllm_afp8"},
         "",
         aligned(256, 256),
         {},
         /*only_when_forced=*/true},
        {"flashinfer_cutlass_mxfp4_mxfp8",
         {"flashinfer_cutlass_afp8"},
         "",
         aligned(128, 128),
         {},
         /*only_when_forced=*/true},
    });

}  // namespace

QuantConfig Mxfp4MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                    OcpMxDType activation_dtype,
                                                    OcpMxDType weight_dtype,
                                                    const MxParams& params) {
  if (activation_dtype == OcpMxDType::kFp8 && weight_dtype == OcpMxDType::kMxfp4) {
    return mxfp4_w4a8_moe_quant_config(shape, params);
  }
  return ocp_mx_moe_quant_config(shape, activation_dtype, weight_dtype, params);
}

}  // namespace moekit
