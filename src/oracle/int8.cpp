#include "moekit/oracle/int8.h"

#include "seed_backends.h"

namespace moekit {
namespace {

const SeedBackends kSeedInt8(QuantOracleKind::kInt8, {{"triton"}});

}  // namespace

QuantConfig Int8MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                   const Int8W8A8Params& params) {
  return int8_w8a8_moe_quant_config(shape, params);
}

}  // namespace moekit
