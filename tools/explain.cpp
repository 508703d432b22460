// `moekit explain`: the plan for a deployment — the experts oracle's table, the prepare/finalize
// table and the weight layout — without running anything.
#include <iostream>

#include "cli_common.h"
#include "moekit/core/error.h"
#include "moekit/oracle/plan.h"

namespace moekit::cli {

int explain_command(const DeploymentOptions& deployment) {
  const ModelPreset model = deployment.model_preset();
  const MoELayerOptions options = deployment.planning_options();
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  std::cout << "model        " << model.summary() << "\n";
  std::cout << "deployment   " << moe.to_string() << "\n";
  std::cout << "quantization unquantized (" << dtype_name(options.dtype) << ")\n";
  std::cout << device_note(options.device) << "\n";
  PlanOptions plan_options;
  plan_options.log = false;
  plan_options.preview = true;  // the layer would be given its communicator
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), plan_options);
  const std::string shared = MoELayer::shared_experts_note(model, moe, QuantConfig::unquantized(),
                                                           plan, options.shared_experts);
  if (!shared.empty()) std::cout << "shared       " << shared << "\n";
  std::cout << plan.to_string();
  return plan.ok() ? 0 : 1;
}

}  // namespace moekit::cli
