#include "moekit/oracle/for_scheme.h"

#include <fmt/format.h>

#include "moekit/config/quant_factories.h"
#include "moekit/core/error.h"
#include "moekit/oracle/plan.h"

namespace moekit {

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
  PlanOptions options;
  options.log = false;
  try {
    return plan_moe(moe, quant, options).experts_report;
  } catch (const UnsupportedError&) {
    throw;  // no oracle serves the scheme
  } catch (const Error& e) {
    OracleReport report;
    report.error = e.what();
    return report;
  }
}

std::unique_ptr<FusedMoEKernel> make_kernel_for(const MoEConfig& moe, const QuantConfig& quant,
                                                std::shared_ptr<SharedExperts> shared) {
  const MoEPlan plan = plan_moe(moe, quant);
  return make_kernel(plan, moe, quant, std::move(shared));
}

}  // namespace moekit
