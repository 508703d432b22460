#include "moekit/oracle/int8.h"

#include "moekit/experts/cpu_emulation.h"

namespace moekit {

KernelRegistry<Int8MoeBackend>& Int8MoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle.
  static KernelRegistry<Int8MoeBackend> instance(KernelRegistry<Int8MoeBackend>::Table{
      {Int8MoeBackend::kCpu, {&CpuInt8Experts::klass()}},
  });
  return instance;
}

std::vector<Int8MoeBackend> Int8MoEKernelOracle::backend_values() const {
  return {Backend::kTriton, Backend::kCpu};
}

std::string Int8MoEKernelOracle::backend_name(Backend backend) const {
  return backend == Backend::kTriton ? "triton" : "cpu";
}

std::vector<Int8MoeBackend> Int8MoEKernelOracle::priority_backends(const MoEConfig&) const {
  return {Backend::kTriton, Backend::kCpu};
}

QuantConfig Int8MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                   const Int8W8A8Params& params) const {
  return int8_w8a8_moe_quant_config(shape, params);
}

}  // namespace moekit
