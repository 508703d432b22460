#include "moekit/oracle/oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "moekit/core/env.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/oracle/make_moe_kernel.h"

namespace moekit {
namespace oracle_detail {

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string format_name_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    out += "'" + names[i] + "'";
  }
  return out + "]";
}

}  // namespace oracle_detail

std::string OracleReport::to_string() const {
  size_t backend_w = 7, class_w = 13;
  for (const Candidate& c : candidates) {
    backend_w = std::max(backend_w, c.backend.size());
    class_w = std::max(class_w, c.experts_class.size());
  }
  std::string out = fmt::format("{} MoE oracle", oracle_name);
  if (!forced_by.empty()) out += fmt::format(" (backend forced by {})", forced_by);
  out += "\n";
  out += fmt::format("  {:<{}}  {:<{}}  {:<9}  {}\n", "backend", backend_w, "experts class",
                     class_w, "verdict", "reason");
  for (const Candidate& c : candidates) {
    const bool chosen = c.backend == chosen_backend && c.experts_class == chosen_experts;
    const char* verdict = chosen          ? "CHOSEN"
                          : !c.considered ? "skipped"
                          : c.supported   ? "supported"
                                          : "rejected";
    std::string reason = c.reason;
    if (!c.considered && reason.empty()) reason = "not considered for this deployment";
    out += fmt::format("  {:<{}}  {:<{}}  {:<9}  {}\n", c.backend, backend_w,
                       c.experts_class.empty() ? "-" : c.experts_class, class_w, verdict, reason);
  }
  if (ok()) {
    out += fmt::format("chosen: {} / {}\n", chosen_backend, chosen_experts);
  } else {
    out += fmt::format("error: {}\n", error);
  }
  return out;
}

MoEKernelOracle::MoEKernelOracle(QuantOracleKind kind, MoEConfig moe_config,
                                 std::optional<QuantKey> weight_key,
                                 std::optional<QuantKey> activation_key,
                                 const BackendRegistry& registry)
    : kind_(kind),
      moe_config_(std::move(moe_config)),
      weight_key_(std::move(weight_key)),
      activation_key_(std::move(activation_key)),
      registry_(registry) {}

std::vector<std::string> MoEKernelOracle::backend_values() const {
  std::vector<std::string> out;
  for (const ExpertsBackend& b : registry_.backends(kind_))
    out.push_back(b.name);
  return out;
}

ExpertsBackend MoEKernelOracle::backend(std::string_view name) const {
  auto b = registry_.find(kind_, name);
  if (!b) {
    throw Error(fmt::format("Unknown {} MoE backend '{}'; valid names: {}", this->name(), name,
                            valid_names()));
  }
  return *b;
}

std::vector<std::string> MoEKernelOracle::priority_backends(const MoEConfig& moe_config) const {
  std::vector<std::pair<int, std::string>> ranked;
  for (const ExpertsBackend& b : registry_.backends(kind_)) {
    if (b.only_when_forced) continue;
    if (!b.candidate_on.empty() && std::find(b.candidate_on.begin(), b.candidate_on.end(),
                                             moe_config.device.type) == b.candidate_on.end()) {
      continue;
    }
    if (auto p = priority_for(b, moe_config)) ranked.emplace_back(*p, b.name);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& [p, name] : ranked)
    out.push_back(std::move(name));
  return out;
}

std::optional<std::string> MoEKernelOracle::batched_variant(std::string_view name) const {
  const ExpertsBackend b = backend(name);
  if (b.batched_variant.empty()) return std::nullopt;
  return b.batched_variant;
}

std::vector<const ExpertsClass*> MoEKernelOracle::backend_to_kernel_classes(
    std::string_view name) const {
  auto b = registry_.find(kind_, name);
  return b ? b->classes : std::vector<const ExpertsClass*>{};
}

std::string MoEKernelOracle::map_backend(std::string_view user_name) const {
  const std::string wanted = oracle_detail::lowercase(user_name);
  const auto all = registry_.backends(kind_);
  for (const ExpertsBackend& b : all) {
    if (oracle_detail::lowercase(b.name) == wanted) return b.name;
  }
  for (const ExpertsBackend& b : all) {
    for (const std::string& alias : b.aliases) {
      if (oracle_detail::lowercase(alias) == wanted) return b.name;
    }
  }
  throw Error(fmt::format("Unknown {} MoE backend '{}'; valid names: {}", name(), user_name,
                          valid_names()));
}

std::string MoEKernelOracle::valid_names() const {
  std::string out = "auto";
  std::vector<std::string> aliases;
  for (const ExpertsBackend& b : registry_.backends(kind_)) {
    out += ", " + b.name;
    for (const std::string& a : b.aliases)
      aliases.push_back(fmt::format("{} -> {}", a, b.name));
  }
  if (!aliases.empty()) out += fmt::format(" (aliases: {})", fmt::join(aliases, ", "));
  return out;
}

std::string MoEKernelOracle::make_log_backend(
    std::string_view backend, const std::optional<std::vector<std::string>>& available,
    bool is_lora) const {
  std::string avail;
  if (available) avail = " out of potential backends: " + format_backends(*available);
  return fmt::format("Using {} {} MoE {}backend{}.", backend, name(), is_lora ? "LoRA " : "",
                     avail);
}

std::string MoEKernelOracle::make_log_unsupported(std::string_view backend, std::string_view reason,
                                                  bool is_lora) const {
  return fmt::format("{} MoE {}backend '{}' does not support the deployment configuration{}.",
                     name(), is_lora ? "LoRA " : "", backend,
                     reason.empty() ? std::string() : fmt::format(" since {}", reason));
}

MoEKernelOracle::Probe MoEKernelOracle::try_backend(
    std::string_view backend, const std::optional<std::vector<const ExpertsClass*>>& kernel_classes,
    const std::optional<std::optional<QuantKey>>& activation_key) const {
  return probe(backend, kernel_classes, activation_key ? *activation_key : activation_key_,
               /*log_misses=*/true);
}

std::pair<std::string, const ExpertsClass*> MoEKernelOracle::return_or_raise(
    std::string_view backend, const std::optional<std::vector<std::string>>& available,
    const std::optional<std::vector<const ExpertsClass*>>& kernel_classes,
    const std::optional<std::optional<QuantKey>>& activation_key, bool is_lora) const {
  Probe p = try_backend(backend, kernel_classes, activation_key);
  if (p.experts == nullptr) {
    const std::string last = p.rejections.empty() ? std::string() : p.rejections.back().reason;
    throw UnsupportedError(make_log_unsupported(backend, last, is_lora) +
                           format_rejections(p.rejections));
  }
  log::info_once(make_log_backend(backend, available, is_lora));
  return {std::string(backend), p.experts};
}

std::string MoEKernelOracle::format_rejections(const std::vector<Rejection>& rejections) {
  if (rejections.empty()) return {};
  std::string out = "\nCandidates:";
  for (const Rejection& r : rejections) {
    out += fmt::format("\n  {} / {}: {}", r.backend,
                       r.experts ? r.experts->name() : std::string("<none>"), r.reason);
  }
  return out;
}

std::optional<std::pair<std::string, std::string>> MoEKernelOracle::forced_backend(bool log) const {
  std::string requested;
  std::string source;
  if (!moe_config_.moe_backend.empty() &&
      oracle_detail::lowercase(moe_config_.moe_backend) != "auto") {
    requested = moe_config_.moe_backend;
    source = "config";
  } else if (auto from_env = env::get(kMoeBackendEnvVar);
             from_env && oracle_detail::lowercase(*from_env) != "auto") {
    requested = *from_env;
    source = std::string("env ") + kMoeBackendEnvVar;
  } else {
    return std::nullopt;
  }
  std::string chosen = [&] {
    try {
      return map_backend(requested);
    } catch (const Error& e) {
      throw Error(fmt::format("{} (requested by {})", e.what(), source));
    }
  }();
  if (moe_config_.parallel.use_batched_activation_format()) {
    if (auto batched = batched_variant(chosen)) {
      if (log) {
        log::debug_once(fmt::format("{} MoE backend '{}' swapped for its batched variant '{}'",
                                    name(), chosen, *batched));
      }
      chosen = *batched;
    }
  }
  return std::make_pair(chosen, source);
}

MoEKernelOracle::Probe MoEKernelOracle::probe(
    std::string_view backend, const std::optional<std::vector<const ExpertsClass*>>& kernel_classes,
    const std::optional<QuantKey>& activation_key, bool log_misses) const {
  Probe out;
  if (!kernel_classes) (void)this->backend(backend);  // an unknown name lists the valid ones
  const std::vector<const ExpertsClass*> classes =
      kernel_classes ? *kernel_classes : backend_to_kernel_classes(backend);
  if (classes.empty()) {
    if (log_misses) log::debug_once(make_log_unsupported(backend, kNoKernelRegisteredReason));
    out.rejections.push_back(
        {std::string(backend), nullptr, std::string(kNoKernelRegisteredReason)});
    return out;
  }
  const ActivationFormat format = moe_config_.activation_format();
  for (const ExpertsClass* klass : classes) {
    const SupportResult r =
        klass->is_supported_config(moe_config_, weight_key_, activation_key, format);
    if (r.supported) {
      out.experts = klass;
      return out;
    }
    if (log_misses) log::debug_once(make_log_unsupported(backend, r.reason));
    out.rejections.push_back({std::string(backend), klass, r.reason});
  }
  return out;
}

MoEKernelOracle::Decision MoEKernelOracle::decide(bool log) const {
  Decision d;
  OracleReport& report = d.report;
  report.oracle_name = name();
  const auto forced = forced_backend(log);
  const std::vector<std::string> considered =
      forced ? std::vector<std::string>{forced->first} : priority_backends(moe_config_);
  if (forced) report.forced_by = forced->second;

  // One pass over every backend: the considered ones in order, then the others. Each class is
  // probed once; the first supported class of a considered backend wins, and the probes before
  // it are the selection's rejections.
  std::vector<std::string> order = considered;
  for (const std::string& b : backend_values()) {
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  }
  const ActivationFormat format = moe_config_.activation_format();
  Selection selection;
  bool found = false;
  for (const std::string& name : order) {
    const bool is_considered =
        std::find(considered.begin(), considered.end(), name) != considered.end();
    const auto classes = backend_to_kernel_classes(name);
    if (classes.empty()) {
      report.candidates.push_back(
          {name, "", false, std::string(kNoKernelRegisteredReason), is_considered});
      if (is_considered && !found) {
        if (log) log::debug_once(make_log_unsupported(name, kNoKernelRegisteredReason));
        selection.rejections.push_back({name, nullptr, std::string(kNoKernelRegisteredReason)});
      }
      continue;
    }
    for (const ExpertsClass* klass : classes) {
      const SupportResult r =
          klass->is_supported_config(moe_config_, weight_key_, activation_key_, format);
      report.candidates.push_back({name, klass->name(), r.supported, r.reason, is_considered});
      if (!is_considered || found) continue;
      if (r.supported) {
        found = true;
        selection.backend = backend(name);
        selection.experts = klass;
      } else {
        if (log) log::debug_once(make_log_unsupported(name, r.reason));
        selection.rejections.push_back({name, klass, r.reason});
      }
    }
  }
  if (found) {
    report.chosen_backend = selection.backend.name;
    report.chosen_experts = selection.experts->name();
    if (log) {
      log::info_once(forced ? make_log_backend(selection.backend.name)
                            : make_log_backend(selection.backend.name, considered));
    }
    selection.forced_by = report.forced_by;
    selection.report = report;
    d.selection = std::move(selection);
    return d;
  }
  if (forced) {
    const std::string last =
        selection.rejections.empty() ? std::string() : selection.rejections.back().reason;
    d.error = fmt::format("{}\nThe backend was forced by {}; there is no fallback.{}",
                          make_log_unsupported(forced->first, last), forced->second,
                          format_rejections(selection.rejections));
  } else {
    d.error = fmt::format(
        "No {} MoE backend supports the deployment configuration ({} tried: {}).{}", name(),
        considered.size(), format_backends(considered), format_rejections(selection.rejections));
  }
  report.error = d.error;
  return d;
}

MoEKernelOracle::Selection MoEKernelOracle::select_backend() const {
  Decision d = decide(/*log=*/true);
  if (!d.selection) throw UnsupportedError(d.error);
  return std::move(*d.selection);
}

OracleReport MoEKernelOracle::explain() const {
  try {
    return decide(/*log=*/false).report;
  } catch (const Error& e) {
    OracleReport report;
    report.oracle_name = name();
    report.error = e.what();
    return report;
  }
}

std::unique_ptr<FusedMoEKernel> MoEKernelOracle::make_kernel(
    const QuantConfig& quant_config, const Selection& selection,
    std::shared_ptr<SharedExperts> shared_experts) const {
  MOEKIT_CHECK(selection.experts != nullptr, "make_kernel: the selection has no experts class");
  return make_moe_kernel(quant_config, moe_config_, *selection.experts, std::move(shared_experts));
}

QuantConfig MoEKernelOracle::make_quant_config() const {
  throw Error(fmt::format(
      "{} does not implement make_quant_config; this oracle has no quantization-specific config "
      "to build.",
      type_name()));
}

std::string MoEKernelOracle::format_backends(const std::vector<std::string>& backends) const {
  return oracle_detail::format_name_list(backends);
}

}  // namespace moekit
