// Environment variables read by moekit. Every variable is listed in the README.
//   MOEKIT_LOG_LEVEL   trace|debug|info|warn|error|off (default warn)
//   MOEKIT_MOE_BACKEND force an experts backend by its user-facing name (e.g. "cpu_reference")
//   MOEKIT_DISABLE_PDL  diagnostics: the router/align kernels without programmatic dependent launch
//   MOEKIT_DISABLE_DECODE_PAIR  diagnostics: the Hopper experts' two GEMMs as two launches even
//                       where they would run as one decode pair (run_grouped_gemm_pair)
//   MOEKIT_BATCH_INVARIANT  1: every layer batch-invariant (MoELayerOptions::batch_invariant)
// (CPU threads follow OpenMP's OMP_NUM_THREADS.)
//
// NOTE: a variable that is set to a value the reader does not recognise is an error, never a
// silent default: the typed readers below throw moekit::Error naming the variable, its value and
// the values it accepts. An empty variable counts as unset.
#pragma once

#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace moekit::env {

// The raw value; nullopt when unset or empty.
std::optional<std::string> get(const char* name);

// A decimal integer in [min, max]; nullopt when unset. Throws moekit::Error for anything else
// ("MOEKIT_X='4x' is not an integer", "MOEKIT_X=99 is out of range [0, 8]").
std::optional<long long> get_int(const char* name,
                                 long long min = std::numeric_limits<long long>::min(),
                                 long long max = std::numeric_limits<long long>::max());

// 1, true, yes, on / 0, false, no, off (any case); `fallback` when unset. Throws moekit::Error for
// any other value.
bool get_bool(const char* name, bool fallback);

// One of `valid` (compared case-insensitively; returned as spelled in `valid`); nullopt when
// unset. Throws moekit::Error naming the valid values for any other value.
std::optional<std::string> get_choice(const char* name,
                                      std::initializer_list<std::string_view> valid);

}  // namespace moekit::env
