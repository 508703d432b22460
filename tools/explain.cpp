// `moekit explain`: the oracle's full decision table for a deployment, without running anything.
#include <iostream>

#include "cli_common.h"
#include "moekit/oracle/unquantized.h"

namespace moekit::cli {

int explain_command(const DeploymentOptions& deployment) {
  const ModelPreset model = deployment.model_preset();
  const MoELayerOptions options = deployment.layer_options();
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  std::cout << "model        " << model.summary() << "\n";
  std::cout << "deployment   " << moe.to_string() << "\n";
  std::cout << "quantization unquantized (" << dtype_name(options.dtype) << ")\n";
  if (!options.device.present) {
    std::cout << "note         " << options.device.to_string()
              << " is not present here: GPU kernels are listed but cannot be chosen\n";
  }
  std::cout << "\n";
  UnquantizedMoEKernelOracle oracle(moe);
  const OracleReport report = oracle.explain();
  std::cout << report.to_string() << "\n";
  return report.ok() ? 0 : 1;
}

}  // namespace moekit::cli
