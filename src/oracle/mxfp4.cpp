#include "moekit/oracle/mxfp4.h"

#include "moekit/experts/cpu_emulation.h"

namespace moekit {

KernelRegistry<Mxfp4MoeBackend>& Mxfp4MoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle.
  static KernelRegistry<Mxfp4MoeBackend> instance(KernelRegistry<Mxfp4MoeBackend>::Table{
      {Mxfp4MoeBackend::kEmulation, {&CpuMxfp4Experts::klass(), &CpuOcpMxExperts::klass()}},
  });
  return instance;
}

std::vector<Mxfp4MoeBackend> Mxfp4MoEKernelOracle::backend_values() const {
  return {Backend::kFlashinferTrtllmMxfp4Mxfp8,
          Backend::kFlashinferTrtllmMxfp4Bf16,
          Backend::kFlashinferCutlassMxfp4Mxfp8,
          Backend::kFlashinferCutlassMxfp4Bf16,
          Backend::kBatchedMarlin,
          Backend::kMarlin,
          Backend::kCk,
          Backend::kTriton,
          Backend::kTritonUnfused,
          Backend::kXpu,
          Backend::kEmulation};
}

std::string Mxfp4MoEKernelOracle::backend_name(Backend backend) const {
  switch (backend) {
    case Backend::kFlashinferTrtllmMxfp4Mxfp8:
      return "flashinfer_trtllm_mxfp4_mxfp8";
    case Backend::kFlashinferTrtllmMxfp4Bf16:
      return "flashinfer_trtllm_mxfp4_bf16";
    case Backend::kFlashinferCutlassMxfp4Mxfp8:
      return "flashinfer_cutlass_mxfp4_mxfp8";
    case Backend::kFlashinferCutlassMxfp4Bf16:
      return "flashinfer_cutlass_mxfp4_bf16";
    case Backend::kBatchedMarlin:
      return "batched_marlin";
    case Backend::kMarlin:
      return "marlin";
    case Backend::kCk:
      return "ck";
    case Backend::kTriton:
      return "triton";
    case Backend::kTritonUnfused:
      return "triton_unfused";
    case Backend::kXpu:
      return "xpu";
    case Backend::kEmulation:
      return "emulation";
  }
  return "unknown";
}

std::vector<std::pair<std::string, Mxfp4MoeBackend>> Mxfp4MoEKernelOracle::backend_aliases() const {
  return {{"flashinfer_trtllm_afp8", Backend::kFlashinferTrtllmMxfp4Mxfp8},
          {"flashinfer_cutlass_afp8", Backend::kFlashinferCutlassMxfp4Mxfp8},
          {"flashinfer_trtllm", Backend::kFlashinferTrtllmMxfp4Bf16},
          {"flashinfer_cutlass", Backend::kFlashinferCutlassMxfp4Bf16},
          {"aiter", Backend::kCk},
          {"cpu", Backend::kEmulation}};
}

std::vector<Mxfp4MoeBackend> Mxfp4MoEKernelOracle::priority_backends(const MoEConfig&) const {
  return {Backend::kFlashinferTrtllmMxfp4Bf16,
          Backend::kCk,
          Backend::kTriton,
          Backend::kFlashinferCutlassMxfp4Bf16,
          Backend::kTritonUnfused,
          Backend::kMarlin,
          Backend::kBatchedMarlin,
          Backend::kXpu,
          Backend::kEmulation};
}

std::optional<Mxfp4MoeBackend> Mxfp4MoEKernelOracle::batched_variant(Backend backend) const {
  if (backend == Backend::kMarlin) return Backend::kBatchedMarlin;
  return std::nullopt;
}

QuantConfig Mxfp4MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                    OcpMxDType activation_dtype,
                                                    OcpMxDType weight_dtype,
                                                    const MxParams& params) const {
  if (activation_dtype == OcpMxDType::kFp8 && weight_dtype == OcpMxDType::kMxfp4) {
    return mxfp4_w4a8_moe_quant_config(shape, params);
  }
  return ocp_mx_moe_quant_config(shape, activation_dtype, weight_dtype, params);
}

}  // namespace moekit
