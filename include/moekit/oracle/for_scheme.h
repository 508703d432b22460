// Which oracle serves a quantization scheme: oracle_kind_for maps a QuantConfig (its quant_keys_of
// pair) to the oracle kind; plan_moe (plan.h) then decides with that oracle.
//
// Scheme -> oracle: unquantized -> Unquantized; fp8 weights -> FP8; int8 weights with int8
// activations -> INT8; int4 / int8 weight-only -> WNA16; int4 weights with fp8 activations ->
// W4A8; fp4 weights in (1, 16) groups -> NvFp4; OCP MX weights (mxfp4, mxfp6) -> MXFP4.
#pragma once

#include <memory>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

// Throws UnsupportedError naming the scheme when no oracle serves it (e.g. quantized activations
// with unquantized weights).
QuantOracleKind oracle_kind_for(const QuantConfig& quant);

// The experts table of plan_moe(moe, quant) (no log lines). Never throws for an unsupported
// deployment (the report carries the error) except for a scheme no oracle serves.
OracleReport explain_for_scheme(const MoEConfig& moe, const QuantConfig& quant);

// plan_moe(moe, quant) then make_kernel: one selection, then the prepare/finalize and experts.
// Throws UnsupportedError listing every rejected candidate.
std::unique_ptr<FusedMoEKernel> make_kernel_for(const MoEConfig& moe, const QuantConfig& quant,
                                                std::shared_ptr<SharedExperts> shared = nullptr);

}  // namespace moekit
