#include "moekit/oracle/fp8.h"

#include <algorithm>

#include "moekit/experts/cpu_emulation.h"

namespace moekit {

KernelRegistry<Fp8MoeBackend>& Fp8MoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle; GPU kernels register into their backends.
  static KernelRegistry<Fp8MoeBackend> instance(KernelRegistry<Fp8MoeBackend>::Table{
      {Fp8MoeBackend::kCpu, {&CpuFp8Experts::klass()}},
  });
  return instance;
}

std::vector<Fp8MoeBackend> Fp8MoEKernelOracle::backend_values() const {
  return {Backend::kFlashinferTrtllm,
          Backend::kFlashinferCutlass,
          Backend::kDeepGemm,
          Backend::kBatchedDeepGemm,
          Backend::kMarlin,
          Backend::kTriton,
          Backend::kBatchedTriton,
          Backend::kAiter,
          Backend::kVllmCutlass,
          Backend::kBatchedVllmCutlass,
          Backend::kXpu,
          Backend::kCpu};
}

std::string Fp8MoEKernelOracle::backend_name(Backend backend) const {
  switch (backend) {
    case Backend::kFlashinferTrtllm:
      return "flashinfer_trtllm";
    case Backend::kFlashinferCutlass:
      return "flashinfer_cutlass";
    case Backend::kDeepGemm:
      return "deep_gemm";
    case Backend::kBatchedDeepGemm:
      return "batched_deep_gemm";
    case Backend::kMarlin:
      return "marlin";
    case Backend::kTriton:
      return "triton";
    case Backend::kBatchedTriton:
      return "batched_triton";
    case Backend::kAiter:
      return "aiter";
    case Backend::kVllmCutlass:
      return "vllm_cutlass";
    case Backend::kBatchedVllmCutlass:
      return "batched_vllm_cutlass";
    case Backend::kXpu:
      return "xpu";
    case Backend::kCpu:
      return "cpu";
  }
  return "unknown";
}

std::vector<std::pair<std::string, Fp8MoeBackend>> Fp8MoEKernelOracle::backend_aliases() const {
  return {{"deepgemm", Backend::kDeepGemm}, {"emulation", Backend::kCpu}};
}

std::vector<Fp8MoeBackend> Fp8MoEKernelOracle::priority_backends(
    const MoEConfig& moe_config) const {
  std::vector<Backend> order = {Backend::kAiter,
                                Backend::kFlashinferTrtllm,
                                Backend::kFlashinferCutlass,
                                Backend::kDeepGemm,
                                Backend::kVllmCutlass,
                                Backend::kTriton,
                                Backend::kMarlin,
                                Backend::kBatchedDeepGemm,
                                Backend::kBatchedVllmCutlass,
                                Backend::kBatchedTriton,
                                Backend::kXpu,
                                Backend::kCpu};
  if (!allow_vllm_cutlass_) {
    std::erase(order, Backend::kVllmCutlass);
    std::erase(order, Backend::kBatchedVllmCutlass);
  }
  const bool block = weight_key() == quant_keys::kFp8Static128BlockSym ||
                     weight_key() == quant_keys::kFp8Static128BlockE8M0Sym;
  if (moe_config.device.type == DeviceType::kCUDA && moe_config.device.compute_capability == 90 &&
      block) {
    const Backend first =
        moe_config.parallel.use_ep ? Backend::kFlashinferCutlass : Backend::kTriton;
    std::erase(order, first);
    order.insert(order.begin(), first);
  }
  return order;
}

std::optional<Fp8MoeBackend> Fp8MoEKernelOracle::batched_variant(Backend backend) const {
  switch (backend) {
    case Backend::kDeepGemm:
      return Backend::kBatchedDeepGemm;
    case Backend::kTriton:
      return Backend::kBatchedTriton;
    case Backend::kVllmCutlass:
      return Backend::kBatchedVllmCutlass;
    default:
      return std::nullopt;
  }
}

QuantConfig Fp8MoEKernelOracle::make_quant_config(Backend backend, const MoEWeightShape& shape,
                                                  Fp8W8A8Params params) const {
  if (backend == Backend::kMarlin) {
    params.a1_scale = Tensor{};
    params.a2_scale = Tensor{};
    params.per_act_token_quant = false;
    return fp8_w8a16_moe_quant_config(shape, params);
  }
  return fp8_w8a8_moe_quant_config(shape, params);
}

}  // namespace moekit
