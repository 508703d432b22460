#include "moekit/oracle/w4a8.h"

#include "seed_backends.h"

namespace moekit {
namespace {

const SeedBackends kSeedW4A8(QuantOracleKind::kW4A8, {{"cutlass"}});

}  // namespace

QuantConfig W4A8MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                   const W4A8Fp8Params& params) {
  return int4_w4afp8_moe_quant_config(shape, params);
}

}  // namespace moekit
