#include "moekit/prepare_finalize/factory.h"

#include <fmt/format.h>

#include <algorithm>

#include "moekit/core/error.h"

namespace moekit {

std::optional<All2AllBackend> dispatch_key(const ParallelConfig& p) {
  if (p.use_megakernel()) return All2AllBackend::kMegakernel;
  const bool exchange = p.use_all2all_kernels() || p.dp_size > 1 || p.pcp_size > 1 || p.sp_size > 1;
  if (!exchange) return std::nullopt;
  return p.all2all_backend;
}

std::string dispatch_key_name(const std::optional<All2AllBackend>& key) {
  return key ? std::string(all2all_backend_name(*key)) : std::string("no token exchange");
}

PrepareFinalizeRegistry& PrepareFinalizeRegistry::global() {
  static PrepareFinalizeRegistry instance;
  return instance;
}

void PrepareFinalizeRegistry::add(PrepareFinalizeFactory factory) {
  MOEKIT_CHECK(!factory.name.empty(), "a prepare/finalize factory needs a name");
  MOEKIT_CHECK(static_cast<bool>(factory.check) && static_cast<bool>(factory.make),
               "prepare/finalize factory '{}' needs both check and make", factory.name);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const PrepareFinalizeFactory& f : factories_) {
    MOEKIT_CHECK(f.name != factory.name, "a prepare/finalize factory named '{}' already exists",
                 factory.name);
  }
  auto pos = std::upper_bound(
      factories_.begin(), factories_.end(), factory.priority,
      [](int priority, const PrepareFinalizeFactory& f) { return priority < f.priority; });
  factories_.insert(pos, std::move(factory));
}

std::optional<PrepareFinalizeFactory> PrepareFinalizeRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(factories_.begin(), factories_.end(),
                         [&](const PrepareFinalizeFactory& f) { return f.name == name; });
  if (it == factories_.end()) return std::nullopt;
  PrepareFinalizeFactory out = std::move(*it);
  factories_.erase(it);
  return out;
}

std::vector<PrepareFinalizeFactory> PrepareFinalizeRegistry::factories() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return factories_;
}

PrepareFinalizeRegistration::PrepareFinalizeRegistration(PrepareFinalizeFactory factory,
                                                         PrepareFinalizeRegistry& registry)
    : registry_(registry), name_(factory.name) {
  replaced_ = registry_.remove(name_);
  try {
    registry_.add(std::move(factory));
  } catch (...) {
    if (replaced_) registry_.add(std::move(*replaced_));
    throw;
  }
}

PrepareFinalizeRegistration::~PrepareFinalizeRegistration() {
  registry_.remove(name_);
  if (replaced_) {
    try {
      registry_.add(std::move(*replaced_));
    } catch (...) {  // NOTE: cannot happen (the name was free when it was taken out); never throw
    }
  }
}

std::string PrepareFinalizeReport::to_string() const {
  size_t name_w = 4, key_w = 6;
  for (const Candidate& c : candidates) {
    name_w = std::max(name_w, c.name.size());
    key_w = std::max(key_w, c.key.size());
  }
  std::string out = fmt::format("Prepare/finalize (deployment: {})\n", key);
  out += fmt::format("  {:<{}}  {:<{}}  {:<9}  {}\n", "name", name_w, "serves", key_w, "verdict",
                     "reason");
  for (const Candidate& c : candidates) {
    const char* verdict = c.name == chosen ? "CHOSEN" : c.supported ? "supported" : "rejected";
    out += fmt::format("  {:<{}}  {:<{}}  {:<9}  {}\n", c.name, name_w, c.key, key_w, verdict,
                       c.reason);
  }
  out += ok() ? fmt::format("chosen: {}\n", chosen) : fmt::format("error: {}\n", error);
  return out;
}

// NOTE: a forced factory (MoEConfig::prepare_finalize) is checked whatever the key.
PrepareFinalizeSelection select_prepare_finalize(const PrepareFinalizeRequest& request,
                                                 const PrepareFinalizeRegistry& registry) {
  MOEKIT_CHECK(request.moe != nullptr && request.quant != nullptr && request.experts != nullptr,
               "select_prepare_finalize needs the MoEConfig, the QuantConfig and the experts");
  const std::optional<All2AllBackend> key = dispatch_key(request.moe->parallel);
  PrepareFinalizeSelection out;
  out.report.key = dispatch_key_name(key);
  const std::string& forced = request.moe->prepare_finalize;
  const bool forcing = !forced.empty() && forced != "auto";
  const std::vector<PrepareFinalizeFactory> factories = registry.factories();
  if (forcing && std::none_of(factories.begin(), factories.end(),
                              [&](const PrepareFinalizeFactory& f) { return f.name == forced; })) {
    std::vector<std::string> names;
    for (const PrepareFinalizeFactory& f : factories)
      names.push_back(f.name);
    out.report.error = fmt::format("unknown prepare/finalize '{}' (registered: {})", forced,
                                   fmt::join(names, ", "));
    return out;
  }
  bool any_of_key = false;
  std::vector<std::string> reasons;
  for (const PrepareFinalizeFactory& f : factories) {
    PrepareFinalizeReport::Candidate c{f.name, dispatch_key_name(f.all2all), false, ""};
    if (forcing && f.name != forced) {
      c.reason = fmt::format("not the forced prepare/finalize '{}'", forced);
    } else if (!forcing && f.all2all != key) {
      c.reason = f.all2all ? fmt::format("serves all-to-all backend {}", c.key)
                           : "serves deployments that exchange no tokens";
      c.reason += fmt::format(", not {}", out.report.key);
    } else {
      any_of_key = true;
      c.reason = f.check(request);
      c.supported = c.reason.empty();
      if (!c.supported) reasons.push_back(fmt::format("{}: {}", f.name, c.reason));
      if (c.supported && !out.chosen) {
        out.chosen = f;
        out.report.chosen = f.name;
      }
    }
    out.report.candidates.push_back(std::move(c));
  }
  if (!out.chosen) {
    out.report.error =
        forcing || any_of_key
            ? fmt::format("no prepare/finalize can serve {} with {} ({})",
                          request.moe->parallel.to_string(), request.experts->name(),
                          fmt::join(reasons, "; "))
            : fmt::format(
                  "no prepare/finalize is registered for all-to-all backend '{}' ({}): "
                  "this build has no expert-parallel token exchange for it",
                  out.report.key, request.moe->parallel.to_string());
  }
  return out;
}

}  // namespace moekit
