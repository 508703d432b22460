#include "moekit/oracle/oracle.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

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

}  // namespace moekit
