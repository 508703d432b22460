// One entry point for every quantization scheme: picks the oracle that serves a QuantConfig
// (from its quant_keys_of pair), explains its decision or builds the kernel. Used by
// `moekit explain`, `moekit run` and the Quark methods.
//
// Scheme -> oracle: unquantized -> Unquantized; fp8 weights -> FP8; int8 weights with int8
// activations -> INT8; int4 / int8 weight-only -> WNA16; int4 weights with fp8 activations ->
// W4A8; fp4 weights in (1, 16) groups -> NvFp4; OCP MX weights (mxfp4, mxfp6) -> MXFP4.
#pragma once

#include <memory>
#include <string_view>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class QuantOracleKind { kUnquantized, kFp8, kInt8, kIntWna16, kW4A8, kNvfp4, kMxfp4 };
// "unquantized", "fp8", "int8", "int_wna16", "w4a8", "nvfp4", "mxfp4".
std::string_view quant_oracle_kind_name(QuantOracleKind kind);

// Throws UnsupportedError naming the scheme when no oracle serves it (e.g. quantized activations
// with unquantized weights).
QuantOracleKind oracle_kind_for(const QuantConfig& quant);

// The chosen oracle's decision table for `moe` and the QuantConfig's keys. Never throws for an
// unsupported deployment (the report carries the error) except for a scheme no oracle serves.
OracleReport explain_for_scheme(const MoEConfig& moe, const QuantConfig& quant);

// Selects the backend (MoEConfig::moe_backend / MOEKIT_MOE_BACKEND forcing, else the priority
// list) and builds the kernel: the prepare/finalize for the parallel config plus the experts,
// constructed with `quant`. Throws UnsupportedError listing every rejected candidate.
std::unique_ptr<FusedMoEKernel> make_kernel_for(const MoEConfig& moe, const QuantConfig& quant,
                                                std::shared_ptr<SharedExperts> shared = nullptr);

}  // namespace moekit
