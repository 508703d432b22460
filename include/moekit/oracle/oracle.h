// MoEKernelOracle: turns a deployment (MoEConfig + weight/activation quant keys) into the experts
// class that serves it, with a one-line reason for every candidate it drops.
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
// Backend -> experts classes is read from a KernelRegistry at call time, so tests (and later
// builds) can inject classes with ScopedKernelRegistration.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/config/quant_key.h"
#include "moekit/core/env.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/core/tensor.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/make_moe_kernel.h"

namespace moekit {

// The environment variable that forces a backend by its user-facing name ("auto" = no force).
inline constexpr const char* kMoeBackendEnvVar = "MOEKIT_MOE_BACKEND";

// The reason given for a backend whose registry entry is empty.
inline constexpr std::string_view kNoKernelRegisteredReason =
    "no kernel is registered for this backend";

// One row of an oracle's decision table (`moekit explain`). Oracle-independent: names only.
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

// Backend -> experts classes (in priority order within the backend).
//
// NOTE: one instance per oracle module, a documented piece of global mutable state: every access
// holds the registry's mutex, and readers get a copy, so a lookup never observes a half-made
// change.
template <typename BackendT>
class KernelRegistry {
 public:
  using Classes = std::vector<const ExpertsClass*>;
  using Table = std::map<BackendT, Classes>;

  explicit KernelRegistry(Table defaults = {}) : table_(std::move(defaults)) {}
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // The classes registered for `backend` (empty when none).
  Classes classes(BackendT backend) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table_.find(backend);
    return it == table_.end() ? Classes{} : it->second;
  }
  // Replaces the classes of `backend`; returns the previous list.
  Classes exchange(BackendT backend, Classes classes) {
    std::lock_guard<std::mutex> lock(mutex_);
    Classes& slot = table_[backend];
    std::swap(slot, classes);
    return classes;
  }
  // Appends one class to `backend` (a kernel family registering itself).
  void add(BackendT backend, const ExpertsClass* klass) {
    MOEKIT_CHECK(klass != nullptr, "KernelRegistry::add: experts class must not be null");
    std::lock_guard<std::mutex> lock(mutex_);
    table_[backend].push_back(klass);
  }

 private:
  mutable std::mutex mutex_;
  Table table_;
};

// How a ScopedKernelRegistration changes a backend's classes.
enum class RegistrationMode {
  kReplace,  // the given classes only
  kPrepend,  // the given classes first, then the registered ones
  kAppend,   // the registered ones, then the given classes
};

// RAII test hook: changes one backend's classes in a registry and restores them on destruction.
template <typename BackendT>
class ScopedKernelRegistration {
 public:
  using Classes = typename KernelRegistry<BackendT>::Classes;

  ScopedKernelRegistration(KernelRegistry<BackendT>& registry, BackendT backend, Classes classes,
                           RegistrationMode mode = RegistrationMode::kReplace)
      : registry_(registry), backend_(backend) {
    Classes current = registry_.classes(backend);
    Classes next;
    if (mode == RegistrationMode::kAppend) next = current;
    next.insert(next.end(), classes.begin(), classes.end());
    if (mode == RegistrationMode::kPrepend) next.insert(next.end(), current.begin(), current.end());
    previous_ = registry_.exchange(backend, std::move(next));
  }
  ~ScopedKernelRegistration() { registry_.exchange(backend_, std::move(previous_)); }
  ScopedKernelRegistration(const ScopedKernelRegistration&) = delete;
  ScopedKernelRegistration& operator=(const ScopedKernelRegistration&) = delete;

 private:
  KernelRegistry<BackendT>& registry_;
  BackendT backend_;
  Classes previous_;
};

namespace oracle_detail {
std::string lowercase(std::string_view s);
// "['a', 'b']" like the seed's list formatting.
std::string format_name_list(const std::vector<std::string>& names);
}  // namespace oracle_detail

template <typename BackendT>
class MoEKernelOracle {
 public:
  // One probed and rejected candidate. `experts` is null when the backend had no class at all.
  struct Rejection {
    BackendT backend;
    const ExpertsClass* experts = nullptr;
    std::string reason;

    std::string experts_name() const { return experts ? experts->name() : std::string(); }
  };

  struct Selection {
    BackendT backend;
    const ExpertsClass* experts = nullptr;  // never null in a returned Selection
    std::vector<Rejection> rejections;      // every candidate rejected before the winner, in order
    std::string forced_by;                  // "config", "env MOEKIT_MOE_BACKEND" or ""
  };

  // try_backend's result: the first supported class (or null) and every rejection, in order.
  struct Probe {
    const ExpertsClass* experts = nullptr;
    std::vector<Rejection> rejections;
  };

  // The deployment every probe of this oracle checks against (the seed keeps it on the oracle).
  explicit MoEKernelOracle(MoEConfig moe_config, std::optional<QuantKey> weight_key = std::nullopt,
                           std::optional<QuantKey> activation_key = std::nullopt)
      : moe_config_(std::move(moe_config)),
        weight_key_(std::move(weight_key)),
        activation_key_(std::move(activation_key)) {}
  virtual ~MoEKernelOracle() = default;
  MoEKernelOracle(const MoEKernelOracle&) = delete;
  MoEKernelOracle& operator=(const MoEKernelOracle&) = delete;

  const MoEConfig& moe_config() const { return moe_config_; }
  const std::optional<QuantKey>& weight_key() const { return weight_key_; }
  const std::optional<QuantKey>& activation_key() const { return activation_key_; }

  // ---- what a concrete oracle provides ---------------------------------------------------------

  // Display name used in the log lines, e.g. "Unquantized".
  virtual std::string name() const = 0;
  // The C++ class name, e.g. "UnquantizedMoEKernelOracle" (make_quant_config's error).
  virtual std::string type_name() const = 0;
  // Every value of the backend enum, in declaration order.
  virtual std::vector<BackendT> backend_values() const = 0;
  // The user-facing name of a backend, e.g. "cpu", "sm90_grouped".
  virtual std::string backend_name(BackendT backend) const = 0;
  // Extra user-facing names: (alias, backend).
  virtual std::vector<std::pair<std::string, BackendT>> backend_aliases() const { return {}; }
  // Backends for this deployment's platform, in priority order.
  virtual std::vector<BackendT> priority_backends(const MoEConfig& moe_config) const = 0;
  // The batched-format variant of a backend (swapped in for a forced backend when the parallel
  // config uses the batched activation format); nullopt when the backend has none.
  virtual std::optional<BackendT> batched_variant(BackendT /*backend*/) const {
    return std::nullopt;
  }
  // The registry this oracle reads backend -> classes from.
  virtual KernelRegistry<BackendT>& kernel_registry() const = 0;

  // Backend -> experts classes in priority order. NOTE: reads the registry at call time.
  virtual std::vector<const ExpertsClass*> backend_to_kernel_classes(BackendT backend) const {
    return kernel_registry().classes(backend);
  }

  // ---- names -----------------------------------------------------------------------------------

  // User-facing name (or alias, case-insensitive) -> backend. Throws moekit::Error listing the
  // valid names for an unknown one.
  virtual BackendT map_backend(std::string_view user_name) const {
    const std::string wanted = oracle_detail::lowercase(user_name);
    for (BackendT b : backend_values()) {
      if (oracle_detail::lowercase(backend_name(b)) == wanted) return b;
    }
    for (const auto& [alias, b] : backend_aliases()) {
      if (oracle_detail::lowercase(alias) == wanted) return b;
    }
    throw Error(fmt::format("Unknown {} MoE backend '{}'; valid names: {}", name(), user_name,
                            valid_names()));
  }

  // "auto, cpu, cpu_batched, ... (aliases: cuda -> sm90_grouped, ...)"
  std::string valid_names() const {
    std::string out = "auto";
    for (BackendT b : backend_values())
      out += ", " + backend_name(b);
    const auto aliases = backend_aliases();
    if (!aliases.empty()) {
      out += " (aliases:";
      for (size_t i = 0; i < aliases.size(); ++i) {
        out += fmt::format("{} {} -> {}", i == 0 ? "" : ",", aliases[i].first,
                           backend_name(aliases[i].second));
      }
      out += ")";
    }
    return out;
  }

  // ---- the seed's log lines --------------------------------------------------------------------

  // "Using <backend> <Name> MoE backend out of potential backends: ['a', 'b']."
  std::string make_log_backend(BackendT backend,
                               const std::optional<std::vector<BackendT>>& available = std::nullopt,
                               bool is_lora = false) const {
    std::string avail;
    if (available) avail = " out of potential backends: " + format_backends(*available);
    return fmt::format("Using {} {} MoE {}backend{}.", backend_name(backend), name(),
                       is_lora ? "LoRA " : "", avail);
  }

  // "<Name> MoE backend '<backend>' does not support the deployment configuration since <reason>."
  std::string make_log_unsupported(BackendT backend, std::string_view reason,
                                   bool is_lora = false) const {
    return fmt::format("{} MoE {}backend '{}' does not support the deployment configuration{}.",
                       name(), is_lora ? "LoRA " : "", backend_name(backend),
                       reason.empty() ? std::string() : fmt::format(" since {}", reason));
  }

  // ---- probing ---------------------------------------------------------------------------------

  // Probes `backend`'s classes (or `kernel_classes` when given); the first supported one wins.
  // `activation_key` overrides the oracle's own key when given (an inner nullopt = unquantized).
  // Each miss logs a debug line. A backend with no class yields one rejection with
  // kNoKernelRegisteredReason.
  Probe try_backend(
      BackendT backend,
      const std::optional<std::vector<const ExpertsClass*>>& kernel_classes = std::nullopt,
      const std::optional<std::optional<QuantKey>>& activation_key = std::nullopt) const {
    return probe(moe_config_, weight_key_, activation_key ? *activation_key : activation_key_,
                 backend, kernel_classes, /*log=*/true);
  }

  // Returns `backend` with its first supported class (logging the seed's "Using ..." line), or
  // throws UnsupportedError: the seed's unsupported line (with the last reason), then one line per
  // candidate and its reason.
  std::pair<BackendT, const ExpertsClass*> return_or_raise(
      BackendT backend, const std::optional<std::vector<BackendT>>& available = std::nullopt,
      const std::optional<std::vector<const ExpertsClass*>>& kernel_classes = std::nullopt,
      const std::optional<std::optional<QuantKey>>& activation_key = std::nullopt,
      bool is_lora = false) const {
    Probe p = try_backend(backend, kernel_classes, activation_key);
    if (p.experts == nullptr) {
      const std::string last = p.rejections.empty() ? std::string() : p.rejections.back().reason;
      throw UnsupportedError(make_log_unsupported(backend, last, is_lora) +
                             format_rejections(p.rejections));
    }
    log::info_once(make_log_backend(backend, available, is_lora));
    return {backend, p.experts};
  }

  // "\nCandidates:\n  cpu / CpuReferenceExperts: <reason>" (one line per rejection), or "".
  std::string format_rejections(const std::vector<Rejection>& rejections) const {
    if (rejections.empty()) return {};
    std::string out = "\nCandidates:";
    for (const Rejection& r : rejections) {
      out += fmt::format("\n  {} / {}: {}", backend_name(r.backend),
                         r.experts ? r.experts->name() : std::string("<none>"), r.reason);
    }
    return out;
  }

  // ---- selection -------------------------------------------------------------------------------

  // The primary entry point (see the rule at the top of this file). Throws UnsupportedError when
  // nothing (or a forced backend that) cannot serve the deployment, moekit::Error for an unknown
  // backend name.
  virtual Selection select_backend(const MoEConfig& moe_config,
                                   const std::optional<QuantKey>& weight_key,
                                   const std::optional<QuantKey>& activation_key) const {
    return select(moe_config, weight_key, activation_key, /*log=*/true);
  }
  // Selection for the oracle's own deployment.
  Selection select_backend() const {
    return select_backend(moe_config_, weight_key_, activation_key_);
  }

  // The decision table for `moekit explain`: every backend and class with its verdict, the choice
  // or the selection error. Never throws for an unsupported deployment and never runs a kernel.
  // Uses the same rule as select_backend (without its log lines); the table lists the considered
  // backends (the forced one, or the priority list) first, then the others, every class of each.
  OracleReport explain(const MoEConfig& moe_config, const std::optional<QuantKey>& weight_key,
                       const std::optional<QuantKey>& activation_key) const {
    OracleReport report;
    report.oracle_name = name();
    std::vector<BackendT> considered;
    try {
      if (auto forced = forced_backend(moe_config, /*log=*/false)) {
        considered = {forced->first};
        report.forced_by = forced->second;
      } else {
        considered = priority_backends(moe_config);
      }
      const Selection selection = select(moe_config, weight_key, activation_key, /*log=*/false);
      report.chosen_backend = backend_name(selection.backend);
      report.chosen_experts = selection.experts->name();
    } catch (const Error& e) {
      report.error = e.what();
    }
    std::vector<BackendT> order = considered;
    for (BackendT b : backend_values()) {
      if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
    }
    const ActivationFormat format = moe_config.activation_format();
    for (BackendT backend : order) {
      const bool is_considered =
          std::find(considered.begin(), considered.end(), backend) != considered.end();
      const auto classes = backend_to_kernel_classes(backend);
      if (classes.empty()) {
        report.candidates.push_back({backend_name(backend), "", false,
                                     std::string(kNoKernelRegisteredReason), is_considered});
        continue;
      }
      for (const ExpertsClass* klass : classes) {
        const SupportResult r =
            klass->is_supported_config(moe_config, weight_key, activation_key, format);
        report.candidates.push_back(
            {backend_name(backend), klass->name(), r.supported, r.reason, is_considered});
      }
    }
    return report;
  }
  OracleReport explain() const { return explain(moe_config_, weight_key_, activation_key_); }

  // ---- construction ----------------------------------------------------------------------------

  // Builds the kernel (prepare/finalize + experts) for the chosen backend.
  virtual std::unique_ptr<FusedMoEKernel> make_kernel(
      const QuantConfig& quant_config, const MoEConfig& moe_config, BackendT /*backend*/,
      const ExpertsClass& experts, std::shared_ptr<SharedExperts> shared_experts = nullptr) const {
    return make_moe_kernel(quant_config, moe_config, experts, std::move(shared_experts));
  }

  // Shuffles the weights into `backend`'s layout. Default: unchanged.
  // w13: (E_local, 2I or I, H), w2: (E_local, H, I).
  virtual std::pair<Tensor, Tensor> convert_to_kernel_format(BackendT /*backend*/,
                                                             const MoEConfig& /*moe_config*/,
                                                             Tensor w13, Tensor w2) const {
    return {std::move(w13), std::move(w2)};
  }

  // The same for GEMM1's bias (E_local, 2I or I), whose rows follow w13's. Default: unchanged.
  virtual Tensor convert_w13_bias_to_kernel_format(BackendT /*backend*/,
                                                   const MoEConfig& /*moe_config*/,
                                                   Tensor w13_bias) const {
    return w13_bias;
  }

  // Builds the quantization config of a quantized oracle. Unquantized oracles throw.
  virtual QuantConfig make_quant_config() const {
    throw Error(fmt::format(
        "{} does not implement make_quant_config; this oracle has no quantization-specific config "
        "to build.",
        type_name()));
  }

 protected:
  // (backend, "config" | "env MOEKIT_MOE_BACKEND") when a backend is forced, with the batched
  // variant swapped in when the parallel config uses the batched format. Throws moekit::Error
  // for an unknown name.
  std::optional<std::pair<BackendT, std::string>> forced_backend(const MoEConfig& moe_config,
                                                                 bool log = true) const {
    std::string requested;
    std::string source;
    if (!moe_config.moe_backend.empty() &&
        oracle_detail::lowercase(moe_config.moe_backend) != "auto") {
      requested = moe_config.moe_backend;
      source = "config";
    } else if (auto from_env = env::get(kMoeBackendEnvVar);
               from_env && oracle_detail::lowercase(*from_env) != "auto") {
      requested = *from_env;
      source = std::string("env ") + kMoeBackendEnvVar;
    } else {
      return std::nullopt;
    }
    BackendT backend = [&] {
      try {
        return map_backend(requested);
      } catch (const Error& e) {
        throw Error(fmt::format("{} (requested by {})", e.what(), source));
      }
    }();
    if (moe_config.parallel.use_batched_activation_format()) {
      if (auto batched = batched_variant(backend)) {
        if (log)
          log::debug_once(fmt::format("{} MoE backend '{}' swapped for its batched variant '{}'",
                                      name(), backend_name(backend), backend_name(*batched)));
        backend = *batched;
      }
    }
    return std::make_pair(backend, source);
  }

  // The selection rule; `log` emits the seed's debug/info lines (select_backend) or not (explain).
  Selection select(const MoEConfig& moe_config, const std::optional<QuantKey>& weight_key,
                   const std::optional<QuantKey>& activation_key, bool log) const {
    if (auto forced = forced_backend(moe_config, log)) {
      const BackendT backend = forced->first;
      Probe p = probe(moe_config, weight_key, activation_key, backend, std::nullopt, log);
      if (p.experts == nullptr) {
        const std::string last = p.rejections.empty() ? std::string() : p.rejections.back().reason;
        throw UnsupportedError(fmt::format(
            "{}\nThe backend was forced by {}; there is no fallback.{}",
            make_log_unsupported(backend, last), forced->second, format_rejections(p.rejections)));
      }
      if (log) log::info_once(make_log_backend(backend));
      return Selection{backend, p.experts, std::move(p.rejections), forced->second};
    }
    const std::vector<BackendT> priority = priority_backends(moe_config);
    std::vector<Rejection> rejections;
    for (BackendT backend : priority) {
      Probe p = probe(moe_config, weight_key, activation_key, backend, std::nullopt, log);
      rejections.insert(rejections.end(), p.rejections.begin(), p.rejections.end());
      if (p.experts != nullptr) {
        if (log) log::info_once(make_log_backend(backend, priority));
        return Selection{backend, p.experts, std::move(rejections), ""};
      }
    }
    throw UnsupportedError(fmt::format(
        "No {} MoE backend supports the deployment configuration ({} tried: {}).{}", name(),
        priority.size(), format_backends(priority), format_rejections(rejections)));
  }

  // try_backend for an explicit deployment.
  Probe probe(const MoEConfig& moe_config, const std::optional<QuantKey>& weight_key,
              const std::optional<QuantKey>& activation_key, BackendT backend,
              const std::optional<std::vector<const ExpertsClass*>>& kernel_classes,
              bool log_misses) const {
    Probe out;
    const std::vector<const ExpertsClass*> classes =
        kernel_classes ? *kernel_classes : backend_to_kernel_classes(backend);
    if (classes.empty()) {
      if (log_misses) log::debug_once(make_log_unsupported(backend, kNoKernelRegisteredReason));
      out.rejections.push_back({backend, nullptr, std::string(kNoKernelRegisteredReason)});
      return out;
    }
    const ActivationFormat format = moe_config.activation_format();
    for (const ExpertsClass* klass : classes) {
      const SupportResult r =
          klass->is_supported_config(moe_config, weight_key, activation_key, format);
      if (r.supported) {
        out.experts = klass;
        return out;
      }
      if (log_misses) log::debug_once(make_log_unsupported(backend, r.reason));
      out.rejections.push_back({backend, klass, r.reason});
    }
    return out;
  }

  std::string format_backends(const std::vector<BackendT>& backends) const {
    std::vector<std::string> names;
    names.reserve(backends.size());
    for (BackendT b : backends)
      names.push_back(backend_name(b));
    return oracle_detail::format_name_list(names);
  }

 private:
  MoEConfig moe_config_;
  std::optional<QuantKey> weight_key_;
  std::optional<QuantKey> activation_key_;
};

}  // namespace moekit
