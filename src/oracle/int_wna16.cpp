#include "moekit/oracle/int_wna16.h"

#include "seed_backends.h"

namespace moekit {
namespace {

const SeedBackends kSeedWna16(QuantOracleKind::kIntWna16,
                              {
                                  {"flashinfer_trtllm", {}, "", {}, {DeviceType::kCUDA}},
                                  {"marlin", {}, "batched_marlin", {}, {DeviceType::kCUDA}},
                                  {"batched_marlin", {}, "", {}, {DeviceType::kCUDA}},
                                  {"humming", {}, "", {}, {DeviceType::kCUDA}},
                                  {"xpu", {}, "", {}, {}, /*only_when_forced=*/true},
                              });

}  // namespace

QuantConfig IntWna16MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                       const IntWna16Params& params) {
  return int_wna16_moe_quant_config(shape, params);
}

}  // namespace moekit
