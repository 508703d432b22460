// Logging through spdlog under the logger name "moekit". The level comes from the environment
// variable MOEKIT_LOG_LEVEL (trace, debug, info, warn, error, off; default warn), read at the first
// log call; any other value makes that call (and every later one, until set_level) throw
// moekit::Error naming the variable, its value and the valid levels. The *_once helpers print a
// given message only the first time, as the seed's info_once / debug_once do.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace moekit::log {

enum class Level { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// MOEKIT_LOG_LEVEL parsed (kWarn when unset). Throws moekit::Error for an unknown value.
Level level_from_env();
// Overrides MOEKIT_LOG_LEVEL.
void set_level(Level level);
// Forgets set_level and the level read so far: the next call reads MOEKIT_LOG_LEVEL again (tests).
void reset_level();
// The level in force (throws like level_from_env on first use).
Level level();
bool enabled(Level level);

void debug(std::string_view message);
void info(std::string_view message);
void warn(std::string_view message);
void error(std::string_view message);
void debug_once(std::string_view message);
void info_once(std::string_view message);
void warn_once(std::string_view message);

// Test hook: every message that passes the level filter is also handed to the callback.
// Returns an id for remove_callback.
int add_callback(std::function<void(Level, const std::string&)> callback);
void remove_callback(int id);
// Forgets which *_once messages were already printed (tests).
void reset_once_cache();

}  // namespace moekit::log
