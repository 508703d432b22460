// MoEKernelOracle: turns a deployment (MoEConfig + weight/activation quant keys) into the experts
// backend and class that serve it, with a one-line reason for every candidate it drops. The
// backends are data (backend.h): the oracle reads them from a BackendRegistry at call time.
//
// Selection rule (every oracle):
//   1. MoEConfig::moe_backend other than "auto" forces a backend (map_backend); when the parallel
//      config uses the batched activation format the backend's batched variant is swapped in. A
//      forced backend that cannot serve the deployment throws UnsupportedError with its reasons;
//      it never falls back to another backend.
//   2. Otherwise the environment variable MOEKIT_MOE_BACKEND forces a backend the same way.
//   3. Otherwise priority_backends() is walked and the first supported experts class wins; when
//      none is supported, UnsupportedError lists every candidate and its reason.
//
// select() decides once and returns the decision together with its table (the report that
// `moekit explain` prints); there is no second pass that could disagree with it.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/config/quant_key.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/backend.h"

namespace moekit {

// The environment variable that forces a backend by its user-facing name ("auto" = no force).
inline constexpr const char* kMoeBackendEnvVar = "MOEKIT_MOE_BACKEND";

// The reason given for a backend that has no experts class in this build.
inline constexpr std::string_view kNoKernelRegisteredReason =
    "no kernel is registered for this backend";

// One oracle decision as a table (`moekit explain`). Names only: printable and copyable.
struct OracleReport {
  struct Candidate {
    std::string backend;        // user-facing backend name, e.g. "cpu"
    std::string experts_class;  // e.g. "CpuReferenceExperts"; "" when no kernel is registered
    bool supported = false;     // is_supported_config passed
    std::string reason;         // why not (empty when supported)
    bool considered = false;    // in the priority list, or the forced backend
  };

  std::string oracle_name;            // e.g. "Unquantized"
  std::vector<Candidate> candidates;  // considered backends in order, then the others
  std::string chosen_backend;         // "" when selection failed
  std::string chosen_experts;         // "" when selection failed
  std::string error;                  // the selection error, "" when one was chosen
  std::string forced_by;              // "config", "env MOEKIT_MOE_BACKEND" or ""

  bool ok() const { return error.empty(); }
  // A readable multi-line table.
  std::string to_string() const;
};

namespace oracle_detail {
std::string lowercase(std::string_view s);
// "['a', 'b']" like the seed's list formatting.
std::string format_name_list(const std::vector<std::string>& names);
}  // namespace oracle_detail

class MoEKernelOracle {
 public:
  // One probed and rejected candidate. `experts` is null when the backend had no class at all.
  struct Rejection {
    std::string backend;
    const ExpertsClass* experts = nullptr;
    std::string reason;

    std::string experts_name() const { return experts ? experts->name() : std::string(); }
  };

  // A decision: the chosen backend and class, every rejection before the winner, and the table.
  struct Selection {
    ExpertsBackend backend;                 // the chosen backend's record
    const ExpertsClass* experts = nullptr;  // never null in a returned Selection
    std::vector<Rejection> rejections;      // every candidate rejected before the winner, in order
    std::string forced_by;                  // "config", "env MOEKIT_MOE_BACKEND" or ""
    OracleReport report;                    // the full decision table
  };

  // try_backend's result: the first supported class (or null) and every rejection, in order.
  struct Probe {
    const ExpertsClass* experts = nullptr;
    std::vector<Rejection> rejections;
  };

  // The deployment every probe of this oracle checks against (the seed keeps it on the oracle).
  MoEKernelOracle(QuantOracleKind kind, MoEConfig moe_config,
                  std::optional<QuantKey> weight_key = std::nullopt,
                  std::optional<QuantKey> activation_key = std::nullopt,
                  const BackendRegistry& registry = BackendRegistry::global());
  virtual ~MoEKernelOracle() = default;
  MoEKernelOracle(const MoEKernelOracle&) = delete;
  MoEKernelOracle& operator=(const MoEKernelOracle&) = delete;

  QuantOracleKind kind() const { return kind_; }
  const MoEConfig& moe_config() const { return moe_config_; }
  const std::optional<QuantKey>& weight_key() const { return weight_key_; }
  const std::optional<QuantKey>& activation_key() const { return activation_key_; }
  const BackendRegistry& registry() const { return registry_; }

  // Display name used in the log lines, e.g. "Unquantized".
  virtual std::string name() const = 0;
  // The C++ class name, e.g. "UnquantizedMoEKernelOracle" (make_quant_config's error).
  virtual std::string type_name() const = 0;

  // ---- the backends ----------------------------------------------------------------------------

  // Every backend of this oracle, in registry order (priority, then registration).
  std::vector<std::string> backend_values() const;
  // The registered record of a backend; throws moekit::Error for an unknown name.
  ExpertsBackend backend(std::string_view name) const;
  // Backends for this deployment, in priority order: candidate_on matches the device, not
  // only_when_forced, and the oracle's policy (priority_for) keeps it.
  std::vector<std::string> priority_backends(const MoEConfig& moe_config) const;
  // The batched-format variant of a backend, when it has one.
  std::optional<std::string> batched_variant(std::string_view backend) const;
  // Backend -> experts classes in preference order. NOTE: reads the registry at call time.
  std::vector<const ExpertsClass*> backend_to_kernel_classes(std::string_view backend) const;

  // User-facing name (or alias, case-insensitive) -> the backend's name. Throws moekit::Error
  // listing the valid names for an unknown one.
  std::string map_backend(std::string_view user_name) const;
  // "auto, cpu, cpu_batched, ... (aliases: cuda -> sm90_grouped, ...)"
  std::string valid_names() const;

  // ---- the seed's log lines --------------------------------------------------------------------

  // "Using <backend> <Name> MoE backend out of potential backends: ['a', 'b']."
  std::string make_log_backend(
      std::string_view backend,
      const std::optional<std::vector<std::string>>& available = std::nullopt,
      bool is_lora = false) const;
  // "<Name> MoE backend '<backend>' does not support the deployment configuration since <reason>."
  std::string make_log_unsupported(std::string_view backend, std::string_view reason,
                                   bool is_lora = false) const;

  // ---- probing ---------------------------------------------------------------------------------

  // Probes `backend`'s classes (or `kernel_classes` when given); the first supported one wins.
  // `activation_key` overrides the oracle's own key when given (an inner nullopt = unquantized).
  // A backend with no class yields one rejection with kNoKernelRegisteredReason.
  Probe try_backend(
      std::string_view backend,
      const std::optional<std::vector<const ExpertsClass*>>& kernel_classes = std::nullopt,
      const std::optional<std::optional<QuantKey>>& activation_key = std::nullopt) const;

  // Returns `backend` with its first supported class (logging the seed's "Using ..." line), or
  // throws UnsupportedError: the seed's unsupported line (with the last reason), then one line per
  // candidate and its reason.
  std::pair<std::string, const ExpertsClass*> return_or_raise(
      std::string_view backend,
      const std::optional<std::vector<std::string>>& available = std::nullopt,
      const std::optional<std::vector<const ExpertsClass*>>& kernel_classes = std::nullopt,
      const std::optional<std::optional<QuantKey>>& activation_key = std::nullopt,
      bool is_lora = false) const;

  // "\nCandidates:\n  cpu / CpuReferenceExperts: <reason>" (one line per rejection), or "".
  static std::string format_rejections(const std::vector<Rejection>& rejections);

  // ---- selection -------------------------------------------------------------------------------

  // The decision for the oracle's deployment (the rule at the top of this file), with the seed's
  // log lines. Throws UnsupportedError when nothing (or a forced backend that) cannot serve the
  // deployment, moekit::Error for an unknown backend name; the message carries every reason.
  Selection select_backend() const;
  // The same decision as a table that never throws (an unsupported deployment or an unknown
  // forced name is the report's error) and logs nothing.
  OracleReport explain() const;

  // The one selection pass behind both: the selection when one was chosen, and always the table
  // (with the error when none was). Throws moekit::Error only for an unknown forced name.
  struct Decision {
    std::optional<Selection> selection;  // set when a backend was chosen
    OracleReport report;                 // the table, with the error when none was chosen
    std::string error;
  };
  Decision decide(bool log) const;

  // ---- construction ----------------------------------------------------------------------------

  // Builds the kernel (prepare/finalize + experts) for a selection (make_moe_kernel).
  std::unique_ptr<FusedMoEKernel> make_kernel(
      const QuantConfig& quant_config, const Selection& selection,
      std::shared_ptr<SharedExperts> shared_experts = nullptr) const;

  // Builds the quantization config of a quantized oracle. Unquantized oracles throw.
  virtual QuantConfig make_quant_config() const;

 protected:
  // An oracle's ordering policy for its priority list: the effective priority of a backend that
  // is a candidate on this device, or nullopt to leave it out. Default: the registered priority.
  virtual std::optional<int> priority_for(const ExpertsBackend& backend,
                                          const MoEConfig& moe_config) const {
    return backend.priority;
  }

 private:
  // (backend, "config" | "env MOEKIT_MOE_BACKEND") when a backend is forced.
  std::optional<std::pair<std::string, std::string>> forced_backend(bool log) const;
  Probe probe(std::string_view backend,
              const std::optional<std::vector<const ExpertsClass*>>& kernel_classes,
              const std::optional<QuantKey>& activation_key, bool log_misses) const;
  std::string format_backends(const std::vector<std::string>& backends) const;

  QuantOracleKind kind_;
  MoEConfig moe_config_;
  std::optional<QuantKey> weight_key_;
  std::optional<QuantKey> activation_key_;
  const BackendRegistry& registry_;
};

}  // namespace moekit
