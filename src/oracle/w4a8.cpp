#include "moekit/oracle/w4a8.h"

#include "moekit/experts/cpu_emulation.h"

namespace moekit {

KernelRegistry<W4A8MoeBackend>& W4A8MoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle.
  static KernelRegistry<W4A8MoeBackend> instance(KernelRegistry<W4A8MoeBackend>::Table{
      {W4A8MoeBackend::kCpu, {&CpuW4A8Experts::klass()}},
  });
  return instance;
}

std::vector<W4A8MoeBackend> W4A8MoEKernelOracle::backend_values() const {
  return {Backend::kCutlass, Backend::kCpu};
}

std::string W4A8MoEKernelOracle::backend_name(Backend backend) const {
  return backend == Backend::kCutlass ? "cutlass" : "cpu";
}

std::vector<W4A8MoeBackend> W4A8MoEKernelOracle::priority_backends(const MoEConfig&) const {
  return {Backend::kCutlass, Backend::kCpu};
}

QuantConfig W4A8MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                   const W4A8Fp8Params& params) const {
  return int4_w4afp8_moe_quant_config(shape, params);
}

}  // namespace moekit
