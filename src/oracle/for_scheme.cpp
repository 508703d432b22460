#include "moekit/oracle/for_scheme.h"

#include <fmt/format.h>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/oracle/int_wna16.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/nvfp4.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/oracle/w4a8.h"

namespace moekit {
namespace {

template <typename Fn>
auto with_oracle(const MoEConfig& moe, const QuantConfig& quant, Fn&& fn) {
  const auto [wk, ak] = quant_keys_of(quant);
  switch (oracle_kind_for(quant)) {
    case QuantOracleKind::kUnquantized:
      return fn(UnquantizedMoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kFp8:
      return fn(Fp8MoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kInt8:
      return fn(Int8MoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kIntWna16:
      return fn(IntWna16MoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kW4A8:
      return fn(W4A8MoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kNvfp4:
      return fn(Nvfp4MoEKernelOracle(moe, wk, ak));
    case QuantOracleKind::kMxfp4:
      return fn(Mxfp4MoEKernelOracle(moe, wk, ak));
  }
  throw Error("unknown oracle kind");
}

}  // namespace

std::string_view quant_oracle_kind_name(QuantOracleKind kind) {
  switch (kind) {
    case QuantOracleKind::kUnquantized:
      return "unquantized";
    case QuantOracleKind::kFp8:
      return "fp8";
    case QuantOracleKind::kInt8:
      return "int8";
    case QuantOracleKind::kIntWna16:
      return "int_wna16";
    case QuantOracleKind::kW4A8:
      return "w4a8";
    case QuantOracleKind::kNvfp4:
      return "nvfp4";
    case QuantOracleKind::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

QuantOracleKind oracle_kind_for(const QuantConfig& quant) {
  const QuantDType w = quant.w1.dtype;
  const QuantDType a = quant.a1.dtype;
  switch (w) {
    case QuantDType::kNone:
      if (a == QuantDType::kNone) return QuantOracleKind::kUnquantized;
      break;
    case QuantDType::kFp8E4M3:
    case QuantDType::kFp8E5M2:
      return QuantOracleKind::kFp8;
    case QuantDType::kInt8:
      return a == QuantDType::kNone ? QuantOracleKind::kIntWna16 : QuantOracleKind::kInt8;
    case QuantDType::kInt4:
      return a == QuantDType::kNone ? QuantOracleKind::kIntWna16 : QuantOracleKind::kW4A8;
    case QuantDType::kFp4E2M1:
      return quant.w1.shape == GroupShape{1, 16} ? QuantOracleKind::kNvfp4
                                                 : QuantOracleKind::kMxfp4;
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      return QuantOracleKind::kMxfp4;
  }
  const auto [wk, ak] = quant_keys_of(quant);
  throw UnsupportedError(fmt::format("no MoE oracle serves quantization scheme {}x{} ({})",
                                     quant_key_to_string(wk), quant_key_to_string(ak),
                                     quant.describe()));
}

OracleReport explain_for_scheme(const MoEConfig& moe, const QuantConfig& quant) {
  return with_oracle(moe, quant, [](const auto& oracle) { return oracle.explain(); });
}

std::unique_ptr<FusedMoEKernel> make_kernel_for(const MoEConfig& moe, const QuantConfig& quant,
                                                std::shared_ptr<SharedExperts> shared) {
  return with_oracle(moe, quant, [&](const auto& oracle) {
    const auto selection = oracle.select_backend();
    return oracle.make_kernel(quant, moe, selection.backend, *selection.experts, std::move(shared));
  });
}

}  // namespace moekit
