// Options that plan as on an H200 on any machine, as `moekit explain --device h200` does: the
// device previewed (never probed, kernels never run) and the plan's log off.
#pragma once

#include "moekit/core/device.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/oracle/plan.h"

namespace moekit::testing {

struct PreviewedH200 {
  PlanOptions plan;       // for plan_moe
  MoELayerOptions layer;  // for MoELayer::make_moe_config
};

inline PreviewedH200 previewed_h200() {
  PreviewedH200 p;
  p.plan.preview = true;
  p.plan.log = false;
  p.layer.device = device_info_by_name("h200");
  p.layer.device.preview = true;
  return p;
}

}  // namespace moekit::testing
