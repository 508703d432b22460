// The plan: the one decision a layer is built from. plan_moe() asks the scheme's oracle for the
// experts backend and class, the prepare/finalize factory for the token exchange, and the chosen
// backend for its weight layout — once. `moekit explain` prints the same plan.
//
//   MoEPlan plan = plan_moe(moe, quant);           // never throws for an unsupported deployment
//   plan.check();                                  // UnsupportedError with every reason
//   auto kernel = make_kernel(plan, moe, quant);   // prepare/finalize + experts
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "moekit/comm/communicator.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/expert_weights.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/oracle.h"
#include "moekit/prepare_finalize/factory.h"

namespace moekit {

struct MoEPlan {
  QuantOracleKind oracle = QuantOracleKind::kUnquantized;
  OracleReport experts_report;                    // every experts candidate and its reason
  PrepareFinalizeReport prepare_finalize_report;  // every prepare/finalize candidate
  // Set when ok():
  std::optional<ExpertsBackend> backend;  // the chosen backend's record
  const ExpertsClass* experts = nullptr;  // its chosen class
  std::optional<PrepareFinalizeFactory> prepare_finalize;
  std::optional<WeightLayout> weight_layout;  // nullopt: the standard layout
  std::string kernel_notes;  // the backend's describe_kernels for the deployment, or ""

  bool ok() const { return experts != nullptr && prepare_finalize.has_value(); }
  // The experts selection's error, else the prepare/finalize's, else "".
  std::string error() const;
  // Throws UnsupportedError(error()) unless ok().
  void check() const;
  // Both tables, the weight layout line and the kernel notes.
  std::string to_string() const;
};

struct PlanOptions {
  const BackendRegistry* backends = nullptr;                   // null: BackendRegistry::global()
  const PrepareFinalizeRegistry* prepare_finalizes = nullptr;  // null: the global one
  Communicator* comm = nullptr;                                // offered to prepare/finalize checks
  // Planning only (`moekit explain`, preview devices): prepare/finalize checks do not ask for
  // the communicator the layer would need (PrepareFinalizeRequest::preview).
  bool preview = false;
  bool log = true;  // the oracle's seed log lines (off for `explain`)
};

// The oracle of a scheme, over a registry (oracle/for_scheme.h maps a QuantConfig to a kind).
std::unique_ptr<MoEKernelOracle> make_oracle(
    QuantOracleKind kind, const MoEConfig& moe, const std::optional<QuantKey>& weight_key,
    const std::optional<QuantKey>& activation_key,
    const BackendRegistry& registry = BackendRegistry::global());

// Plans a deployment of the given scheme (oracle kind + quant keys). Never throws for an
// unsupported deployment (see ok() / error()); moekit::Error for an unknown forced backend name.
MoEPlan plan_moe(const MoEConfig& moe, QuantOracleKind kind,
                 const std::optional<QuantKey>& weight_key,
                 const std::optional<QuantKey>& activation_key, const PlanOptions& options = {});
// The same from a QuantConfig (its oracle_kind_for and quant_keys_of).
MoEPlan plan_moe(const MoEConfig& moe, const QuantConfig& quant, const PlanOptions& options = {});

// Builds the kernel of a plan (check()s it first): the planned prepare/finalize and experts.
std::unique_ptr<FusedMoEKernel> make_kernel(const MoEPlan& plan, const MoEConfig& moe,
                                            const QuantConfig& quant,
                                            std::shared_ptr<SharedExperts> shared = nullptr,
                                            Communicator* comm = nullptr);

}  // namespace moekit
