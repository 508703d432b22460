#include "moekit/oracle/int_wna16.h"

#include "moekit/experts/cpu_emulation.h"

namespace moekit {

KernelRegistry<WNA16MoEBackend>& IntWna16MoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle.
  static KernelRegistry<WNA16MoEBackend> instance(KernelRegistry<WNA16MoEBackend>::Table{
      {WNA16MoEBackend::kCpu, {&CpuWna16Experts::klass()}},
      {WNA16MoEBackend::kEmulation, {&CpuWna16Experts::klass()}},
  });
  return instance;
}

std::vector<WNA16MoEBackend> IntWna16MoEKernelOracle::backend_values() const {
  return {Backend::kMarlin,           Backend::kBatchedMarlin, Backend::kHumming,  Backend::kCpu,
          Backend::kFlashinferTrtllm, Backend::kXpu,           Backend::kEmulation};
}

std::string IntWna16MoEKernelOracle::backend_name(Backend backend) const {
  switch (backend) {
    case Backend::kMarlin:
      return "marlin";
    case Backend::kBatchedMarlin:
      return "batched_marlin";
    case Backend::kHumming:
      return "humming";
    case Backend::kCpu:
      return "cpu";
    case Backend::kFlashinferTrtllm:
      return "flashinfer_trtllm";
    case Backend::kXpu:
      return "xpu";
    case Backend::kEmulation:
      return "emulation";
  }
  return "unknown";
}

std::vector<WNA16MoEBackend> IntWna16MoEKernelOracle::priority_backends(
    const MoEConfig& moe_config) const {
  if (moe_config.device.type == DeviceType::kCPU) return {Backend::kCpu};
  return {Backend::kFlashinferTrtllm, Backend::kMarlin, Backend::kBatchedMarlin, Backend::kHumming,
          Backend::kEmulation};
}

std::optional<WNA16MoEBackend> IntWna16MoEKernelOracle::batched_variant(Backend backend) const {
  if (backend == Backend::kMarlin) return Backend::kBatchedMarlin;
  return std::nullopt;
}

QuantConfig IntWna16MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                       const IntWna16Params& params) const {
  return int_wna16_moe_quant_config(shape, params);
}

}  // namespace moekit
