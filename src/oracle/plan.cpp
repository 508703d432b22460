#include "moekit/oracle/plan.h"

#include <fmt/format.h>

#include "moekit/config/quant_factories.h"
#include "moekit/core/error.h"
#include "moekit/oracle/for_scheme.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/oracle/int_wna16.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/nvfp4.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/oracle/w4a8.h"

namespace moekit {

std::string MoEPlan::error() const {
  if (!experts_report.ok()) return experts_report.error;
  if (!prepare_finalize_report.ok()) return prepare_finalize_report.error;
  return {};
}

void MoEPlan::check() const {
  if (!ok()) throw UnsupportedError(error());
}

std::string MoEPlan::to_string() const {
  std::string out = experts_report.to_string();
  out += "\n" + prepare_finalize_report.to_string();
  if (backend) {
    out += fmt::format("\nweights: {}\n",
                       weight_layout ? weight_layout->name : std::string("standard layout"));
    if (backend->traits.weight_only) {
      out += fmt::format(
          "activations: unquantized ({} is weight-only: a checkpoint's activation scales are not "
          "used)\n",
          backend->name);
    }
  }
  if (!kernel_notes.empty()) out += "\nkernels:\n" + kernel_notes;
  return out;
}

std::unique_ptr<MoEKernelOracle> make_oracle(QuantOracleKind kind, const MoEConfig& moe,
                                             const std::optional<QuantKey>& wk,
                                             const std::optional<QuantKey>& ak,
                                             const BackendRegistry& registry) {
  switch (kind) {
    case QuantOracleKind::kUnquantized:
      return std::make_unique<UnquantizedMoEKernelOracle>(moe, wk, ak, registry);
    case QuantOracleKind::kFp8:
      return std::make_unique<Fp8MoEKernelOracle>(moe, wk, ak, false, registry);
    case QuantOracleKind::kInt8:
      return std::make_unique<Int8MoEKernelOracle>(moe, wk, ak, registry);
    case QuantOracleKind::kIntWna16:
      return std::make_unique<IntWna16MoEKernelOracle>(moe, wk, ak, registry);
    case QuantOracleKind::kW4A8:
      return std::make_unique<W4A8MoEKernelOracle>(moe, wk, ak, registry);
    case QuantOracleKind::kNvfp4:
      return std::make_unique<Nvfp4MoEKernelOracle>(moe, wk, ak, registry);
    case QuantOracleKind::kMxfp4:
      return std::make_unique<Mxfp4MoEKernelOracle>(moe, wk, ak, registry);
  }
  throw Error("make_oracle: unknown oracle kind");
}

MoEPlan plan_moe(const MoEConfig& moe, QuantOracleKind kind,
                 const std::optional<QuantKey>& weight_key,
                 const std::optional<QuantKey>& activation_key, const PlanOptions& options) {
  const BackendRegistry& backends =
      options.backends ? *options.backends : BackendRegistry::global();
  const PrepareFinalizeRegistry& pfs =
      options.prepare_finalizes ? *options.prepare_finalizes : PrepareFinalizeRegistry::global();
  const auto oracle = make_oracle(kind, moe, weight_key, activation_key, backends);
  MoEPlan plan;
  plan.oracle = kind;
  MoEKernelOracle::Decision decision = oracle->decide(options.log);
  plan.experts_report = std::move(decision.report);
  if (!decision.selection) {
    plan.prepare_finalize_report.key = dispatch_key_name(dispatch_key(moe.parallel));
    plan.prepare_finalize_report.error = "not chosen: no experts class serves the deployment";
    return plan;
  }
  plan.backend = decision.selection->backend;
  plan.experts = decision.selection->experts;
  plan.weight_layout = plan.backend->layout_for(moe);
  if (plan.backend->describe_kernels) {
    plan.kernel_notes = plan.backend->describe_kernels(moe, weight_key, activation_key);
  }
  // The quant config is only consulted by checks that care about it; the keys decided above.
  static const QuantConfig kUnquantized = QuantConfig::unquantized();
  const PrepareFinalizeRequest request{&moe, &kUnquantized, plan.experts, options.comm,
                                       options.preview};
  PrepareFinalizeSelection pf = select_prepare_finalize(request, pfs);
  plan.prepare_finalize = std::move(pf.chosen);
  plan.prepare_finalize_report = std::move(pf.report);
  return plan;
}

MoEPlan plan_moe(const MoEConfig& moe, const QuantConfig& quant, const PlanOptions& options) {
  const auto [wk, ak] = quant_keys_of(quant);
  return plan_moe(moe, oracle_kind_for(quant), wk, ak, options);
}

std::unique_ptr<FusedMoEKernel> make_kernel(const MoEPlan& plan, const MoEConfig& moe,
                                            const QuantConfig& quant,
                                            std::shared_ptr<SharedExperts> shared,
                                            Communicator* comm) {
  plan.check();
  const PrepareFinalizeRequest request{&moe, &quant, plan.experts, comm};
  const std::string why = plan.prepare_finalize->check(request);
  MOEKIT_CHECK(why.empty(), "prepare/finalize {} cannot serve the layer: {}",
               plan.prepare_finalize->name, why);
  return assemble_moe_kernel(quant, moe, *plan.experts, plan.prepare_finalize->make(request),
                             std::move(shared));
}

}  // namespace moekit
