// Prepare/finalize chosen like experts: each implementation registers a factory beside its class,
// keyed by the all-to-all backend of the deployments it serves (or by "no token exchange"), with a
// check that gives a one-line reason when it cannot serve a deployment. The plan (oracle/plan.h)
// asks the registry once and `moekit explain` prints the table.
//
//   // in the prepare/finalize's .cpp:
//   MOEKIT_REGISTER_PREPARE_FINALIZE(all2all_nccl, [] {
//     PrepareFinalizeFactory f;
//     f.name = "all2all_nccl";
//     f.all2all = All2AllBackend::kNcclAllToAll;
//     f.check = [](const PrepareFinalizeRequest& r) { return r.comm ? "" : "needs a communicator";
//     }; f.make = [](const PrepareFinalizeRequest& r) { return std::make_unique<...>(...); };
//     return f;
//   }());
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "moekit/comm/communicator.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/prepare_finalize.h"

namespace moekit {

// What a prepare/finalize is asked to serve.
struct PrepareFinalizeRequest {
  const MoEConfig* moe = nullptr;
  const QuantConfig* quant = nullptr;
  const ExpertsClass* experts = nullptr;  // the experts it will be paired with
  Communicator* comm = nullptr;           // null for deployments that exchange no tokens
  // Planning only: a factory that needs a communicator does not reject a null one (the layer's
  // construction will check it).
  bool preview = false;
};

struct PrepareFinalizeFactory {
  std::string name;  // e.g. "no_ep"
  // The all-to-all backend of the deployments it serves; nullopt: deployments that exchange no
  // tokens between ranks (dispatch_key() below).
  std::optional<All2AllBackend> all2all;
  int priority = 100;  // lower is tried first among the factories of one key
  // "" when it can serve the request, else why not (one line).
  std::function<std::string(const PrepareFinalizeRequest&)> check;
  std::function<std::unique_ptr<PrepareFinalize>(const PrepareFinalizeRequest&)> make;
  std::string description;  // one line for `moekit explain`
};

// The key a deployment selects prepare/finalize factories by: nullopt when no tokens move between
// ranks (a single rank, or EP inside one data-parallel group, whose ranks see the same tokens and
// sum their outputs), else the deployment's all-to-all backend (kMegakernel for the megakernel).
std::optional<All2AllBackend> dispatch_key(const ParallelConfig& parallel);
// "no token exchange" or the backend's name.
std::string dispatch_key_name(const std::optional<All2AllBackend>& key);

class PrepareFinalizeRegistry {
 public:
  PrepareFinalizeRegistry() = default;
  PrepareFinalizeRegistry(const PrepareFinalizeRegistry&) = delete;
  PrepareFinalizeRegistry& operator=(const PrepareFinalizeRegistry&) = delete;

  // NOTE: the process-wide instance that registrations fill (documented global state, guarded).
  static PrepareFinalizeRegistry& global();

  // Throws moekit::Error for an empty or duplicate name, or a factory without check/make.
  void add(PrepareFinalizeFactory factory);
  std::optional<PrepareFinalizeFactory> remove(const std::string& name);
  // Ordered by (priority, registration order).
  std::vector<PrepareFinalizeFactory> factories() const;

 private:
  mutable std::mutex mutex_;
  std::vector<PrepareFinalizeFactory> factories_;
};

// RAII registration (static: for the program's life; scoped: a test hook).
class PrepareFinalizeRegistration {
 public:
  explicit PrepareFinalizeRegistration(
      PrepareFinalizeFactory factory,
      PrepareFinalizeRegistry& registry = PrepareFinalizeRegistry::global());
  ~PrepareFinalizeRegistration();
  PrepareFinalizeRegistration(const PrepareFinalizeRegistration&) = delete;
  PrepareFinalizeRegistration& operator=(const PrepareFinalizeRegistration&) = delete;

 private:
  PrepareFinalizeRegistry& registry_;
  std::string name_;
  std::optional<PrepareFinalizeFactory> replaced_;
};

// The decision table: every registered factory with its verdict.
struct PrepareFinalizeReport {
  struct Candidate {
    std::string name;
    std::string key;  // dispatch_key_name of the factory
    bool supported = false;
    std::string reason;  // why not ("" when supported)
  };
  std::string key;  // the deployment's dispatch key
  std::vector<Candidate> candidates;
  std::string chosen;  // "" when none
  std::string error;   // "" when one was chosen

  bool ok() const { return error.empty(); }
  std::string to_string() const;
};

struct PrepareFinalizeSelection {
  std::optional<PrepareFinalizeFactory> chosen;
  PrepareFinalizeReport report;
};

// Walks the factories in priority order: a factory of another key is rejected with the key
// mismatch, one of the deployment's key with its own check; the first that passes is chosen.
// MoEConfig::prepare_finalize other than "auto" forces one by name (its check still applies; an
// unknown name is an error listing the registered ones).
// Never throws: when none fits, report.error says why (including "no prepare/finalize is
// registered for all-to-all backend 'x'").
PrepareFinalizeSelection select_prepare_finalize(
    const PrepareFinalizeRequest& request,
    const PrepareFinalizeRegistry& registry = PrepareFinalizeRegistry::global());

}  // namespace moekit

// Registers a prepare/finalize factory for the life of the program (namespace scope, in the .cpp
// of the prepare/finalize class).
#define MOEKIT_REGISTER_PREPARE_FINALIZE(id, ...)                                  \
  static const ::moekit::PrepareFinalizeRegistration moekit_pf_registration_##id { \
    __VA_ARGS__                                                                    \
  }
