// Experts backends as data: each backend is a registration (oracle, name, aliases, priority,
// experts classes, weight layout, traits) that lives beside the experts class it names. The
// oracles (oracle.h) read the registry; adding a backend touches no file of the oracles.
//
//   // next to MyExperts::klass(), in the experts' .cpp:
//   MOEKIT_REGISTER_EXPERTS_BACKEND(my_backend, ([] {
//     ExpertsBackend b;
//     b.oracle = QuantOracleKind::kFp8;
//     b.name = "sm90_fp8_grouped";
//     b.priority = kPriorityNativeGpu;
//     b.candidate_on = {DeviceType::kCUDA};
//     b.classes = {&MyExperts::klass()};
//     return b;
//   }()));
//
// Priority scale (lower is tried first): moekit's own GPU kernels 0..99, the seed's declared
// backends without a moekit kernel 100..899 (their original order), CPU paths 900..999.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_key.h"
#include "moekit/core/device.h"
#include "moekit/modular/expert_weights.h"
#include "moekit/modular/experts.h"

namespace moekit {

// The oracle that serves a quantization scheme (oracle/for_scheme.h maps a QuantConfig to it).
enum class QuantOracleKind { kUnquantized, kFp8, kInt8, kIntWna16, kW4A8, kNvfp4, kMxfp4 };
// "unquantized", "fp8", "int8", "int_wna16", "w4a8", "nvfp4", "mxfp4".
std::string_view quant_oracle_kind_name(QuantOracleKind kind);

inline constexpr int kPriorityNativeGpu = 10;
inline constexpr int kPrioritySeedDeclared = 100;
inline constexpr int kPriorityCpu = 900;

// What a backend needs beyond its experts classes' capability records: read by the layer, the
// Quark methods and the oracles' quant-config builders (never by comparing backend names).
struct BackendTraits {
  int64_t hidden_align = 1;        // checkpoints' H is padded to this multiple (roundup sizes)
  int64_t intermediate_align = 1;  // likewise I
  // Quantized weights with unquantized activations (an fp8 W8A16 kernel): activation scales are
  // dropped from the QuantConfig.
  bool weight_only = false;
  // NVFP4: one activation global scale per expert (else the max over the experts).
  bool per_expert_input_global_scale = false;
};

struct ExpertsBackend {
  QuantOracleKind oracle = QuantOracleKind::kUnquantized;
  std::string name;  // user-facing, unique within the oracle, e.g. "sm90_grouped"
  std::vector<std::string> aliases;
  int priority = kPriorityCpu;               // lower is tried first (scale in the file comment)
  std::vector<DeviceType> candidate_on;      // device types whose priority list has it; empty: all
  bool only_when_forced = false;             // never in a priority list, only by name
  std::vector<const ExpertsClass*> classes;  // in preference order; empty: no moekit kernel
  std::string batched_variant;  // the backend swapped in for the batched format, "" if none
  // The weight layout the backend's kernels read for this deployment; nullopt: standard.
  std::function<std::optional<WeightLayout>(const MoEConfig&)> layout;
  BackendTraits traits;
  std::string description;  // one line for `moekit explain`, optional
  // Optional: what the backend's kernels will do for this deployment (e.g. the GEMM tiles by
  // batch size, with the reasons), as lines for `moekit explain`.
  std::function<std::string(const MoEConfig&, const std::optional<QuantKey>& weight,
                            const std::optional<QuantKey>& activation)>
      describe_kernels;

  std::optional<WeightLayout> layout_for(const MoEConfig& moe) const {
    return layout ? layout(moe) : std::nullopt;
  }
};

// Every registered backend, by oracle. One process-wide instance (global()) that registrations
// fill at static initialisation, plus private instances for tests.
//
// NOTE: the global instance is the project's one documented piece of global mutable state for
// experts backends; every access holds its mutex and readers get copies.
class BackendRegistry {
 public:
  BackendRegistry() = default;
  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  static BackendRegistry& global();

  // Throws moekit::Error when the name (or an alias) is already taken in that oracle (compared
  // case-insensitively, as users name backends), or the record has no name.
  void add(ExpertsBackend backend);
  // Removes a backend (by its name); returns the record, or nullopt when absent.
  std::optional<ExpertsBackend> remove(QuantOracleKind oracle, std::string_view name);
  // The backends of one oracle, ordered by (priority, registration order).
  std::vector<ExpertsBackend> backends(QuantOracleKind oracle) const;
  std::optional<ExpertsBackend> find(QuantOracleKind oracle, std::string_view name) const;

 private:
  mutable std::mutex mutex_;
  std::map<QuantOracleKind, std::vector<ExpertsBackend>> table_;
};

// RAII registration: adds the backend on construction, removes it on destruction (a static
// instance registers for the life of the program; a scoped one is a test hook). When a backend
// of the same name exists it is taken out for the registration's lifetime and put back after.
// NOTE: registrations of one name must end in reverse order of their start (scopes do); ending
// an outer one first would put back the wrong record.
class BackendRegistration {
 public:
  explicit BackendRegistration(ExpertsBackend backend,
                               BackendRegistry& registry = BackendRegistry::global());
  ~BackendRegistration();
  BackendRegistration(const BackendRegistration&) = delete;
  BackendRegistration& operator=(const BackendRegistration&) = delete;

 private:
  BackendRegistry& registry_;
  QuantOracleKind oracle_;
  std::string name_;
  std::optional<ExpertsBackend> replaced_;
};

}  // namespace moekit

// Registers an experts backend for the life of the program (use at namespace scope, in the .cpp
// of the experts class). NOTE: the library is linked whole-archive so that these registrations
// are never dropped by the linker (CMakeLists.txt).
#define MOEKIT_REGISTER_EXPERTS_BACKEND(id, ...)                                \
  static const ::moekit::BackendRegistration moekit_backend_registration_##id { \
    __VA_ARGS__                                                                 \
  }
