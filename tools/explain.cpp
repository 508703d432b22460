// `moekit explain`: the oracle's full decision table for a deployment, without running anything.
#include <iostream>

#include "cli_common.h"
#include "moekit/core/error.h"
#include "moekit/oracle/make_moe_kernel.h"
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
  // The prepare/finalize the kernel would pair with (token exchange between EP ranks).
  const ActivationFormat format = moe.activation_format();
  try {
    const auto pf = maybe_make_prepare_finalize(moe, QuantConfig::unquantized(), format, false);
    std::cout << "prepare/finalize: " << pf->name() << " (" << activation_format_name(format)
              << " format)\n";
  } catch (const Error& e) {
    std::cout << "prepare/finalize: unavailable: " << e.what() << "\n";
    return 1;
  }
  return report.ok() ? 0 : 1;
}

}  // namespace moekit::cli
