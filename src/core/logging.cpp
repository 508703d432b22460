#include "moekit/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "moekit/core/env.h"

namespace moekit::log {
namespace {

constexpr const char* kLevelVar = "MOEKIT_LOG_LEVEL";

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::kTrace:
      return spdlog::level::trace;
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// NOTE: the one piece of global mutable state of the logging module, guarded by its mutex.
struct State {
  std::mutex mutex;
  std::optional<Level> level;  // nullopt: not read from MOEKIT_LOG_LEVEL yet (nor set)
  std::set<std::string> seen;
  std::map<int, std::function<void(Level, const std::string&)>> callbacks;
  int next_id = 1;
  std::shared_ptr<spdlog::logger> logger;
};

State& state() {
  static State s;
  return s;
}

// The level in force; reads MOEKIT_LOG_LEVEL the first time (throws on a bad value, and keeps
// throwing until the variable is fixed or set_level is called). Call with s.mutex held.
Level current_level(State& s) {
  if (!s.level) s.level = level_from_env();
  return *s.level;
}

spdlog::logger& logger(State& s) {
  if (!s.logger) {
    s.logger = spdlog::get("moekit");
    if (!s.logger) s.logger = spdlog::stderr_color_mt("moekit");
    s.logger->set_pattern("[moekit %L] %v");
    s.logger->set_level(spdlog::level::trace);
  }
  return *s.logger;
}

void emit(Level level, std::string_view message, bool once) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const Level current = current_level(s);
  if (level < current || current == Level::kOff) return;
  std::string text(message);
  if (once && !s.seen.insert(text).second) return;
  logger(s).log(to_spdlog(level), "{}", text);
  for (const auto& [id, callback] : s.callbacks)
    callback(level, text);
}

}  // namespace

Level level_from_env() {
  const std::optional<std::string> v =
      env::get_choice(kLevelVar, {"trace", "debug", "info", "warn", "warning", "error", "off"});
  if (!v || *v == "warn" || *v == "warning") return Level::kWarn;
  if (*v == "trace") return Level::kTrace;
  if (*v == "debug") return Level::kDebug;
  if (*v == "info") return Level::kInfo;
  if (*v == "error") return Level::kError;
  return Level::kOff;
}

void set_level(Level level) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().level = level;
}
void reset_level() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().level.reset();
}
Level level() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return current_level(state());
}
bool enabled(Level l) {
  const Level current = level();
  return l >= current && current != Level::kOff;
}

void debug(std::string_view m) {
  emit(Level::kDebug, m, false);
}
void info(std::string_view m) {
  emit(Level::kInfo, m, false);
}
void warn(std::string_view m) {
  emit(Level::kWarn, m, false);
}
void error(std::string_view m) {
  emit(Level::kError, m, false);
}
void debug_once(std::string_view m) {
  emit(Level::kDebug, m, true);
}
void info_once(std::string_view m) {
  emit(Level::kInfo, m, true);
}
void warn_once(std::string_view m) {
  emit(Level::kWarn, m, true);
}

int add_callback(std::function<void(Level, const std::string&)> callback) {
  std::lock_guard<std::mutex> lock(state().mutex);
  const int id = state().next_id++;
  state().callbacks[id] = std::move(callback);
  return id;
}

void remove_callback(int id) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().callbacks.erase(id);
}

void reset_once_cache() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().seen.clear();
}

}  // namespace moekit::log
