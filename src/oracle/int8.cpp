#include "moekit/oracle/int8.h"

#include "seed_backends.h"

namespace moekit {
namespace {

const SeedBackends kSeedInt8(QuantOracleKind::kInt8, {{"triton"}});

}  // namespace

std::vector<QuantScheme> int8_w8a8_schemes() {
  namespace qk = quant_keys;
  return {
      {qk::kInt8StaticChannelSym, qk::kInt8DynamicTokenSym},
      {qk::kInt8StaticChannelSym, qk::kInt8StaticTensorSym},
      {qk::kInt8StaticChannelSym, qk::kInt8DynamicTensorSym},
      {qk::kInt8StaticTensorSym, qk::kInt8DynamicTensorSym},
      {qk::kInt8StaticTensorSym, qk::kInt8StaticTensorSym},
      {qk::kInt8StaticTensorSym, qk::kInt8DynamicTokenSym},
  };
}

QuantConfig Int8MoEKernelOracle::make_quant_config(const MoEWeightShape& shape,
                                                   const Int8W8A8Params& params) {
  return int8_w8a8_moe_quant_config(shape, params);
}

}  // namespace moekit
