// Internal: the seed's declared backends of an oracle — the original's backend names, aliases,
// batched variants and priority order — for which moekit has no kernel. They stay in the tables
// so that `moekit explain` shows the whole original decision, each rejected with "no kernel is
// registered for this backend"; moekit's own kernels register beside their experts classes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moekit/oracle/backend.h"

namespace moekit {

struct SeedBackend {
  std::string name;
  std::vector<std::string> aliases = {};
  std::string batched_variant = {};
  BackendTraits traits = {};
  std::vector<DeviceType> candidate_on = {};  // empty: every device
  bool only_when_forced = false;
};

// Registers `backends` for the life of the object with priorities kPrioritySeedDeclared + 10 * i
// (their order in the list is the original's priority order).
class SeedBackends {
 public:
  SeedBackends(QuantOracleKind oracle, std::vector<SeedBackend> backends) {
    int priority = kPrioritySeedDeclared;
    for (SeedBackend& s : backends) {
      ExpertsBackend b;
      b.oracle = oracle;
      b.name = std::move(s.name);
      b.aliases = std::move(s.aliases);
      b.batched_variant = std::move(s.batched_variant);
      b.traits = s.traits;
      b.candidate_on = std::move(s.candidate_on);
      b.only_when_forced = s.only_when_forced;
      b.priority = priority;
      priority += 10;
      registrations_.push_back(std::make_unique<BackendRegistration>(std::move(b)));
    }
  }

 private:
  std::vector<std::unique_ptr<BackendRegistration>> registrations_;
};

}  // namespace moekit
