#include "moekit/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>
#include <set>

#include "moekit/core/env.h"

namespace moekit::log {
namespace {

Level parse_level(const std::string& s) {
  if (s == "trace") return Level::kTrace;
  if (s == "debug") return Level::kDebug;
  if (s == "info") return Level::kInfo;
  if (s == "warn" || s == "warning") return Level::kWarn;
  if (s == "error") return Level::kError;
  if (s == "off") return Level::kOff;
  return Level::kWarn;
}

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
  Level level = parse_level(env::get("MOEKIT_LOG_LEVEL").value_or("warn"));
  std::set<std::string> seen;
  std::map<int, std::function<void(Level, const std::string&)>> callbacks;
  int next_id = 1;
  std::shared_ptr<spdlog::logger> logger;
};

State& state() {
  static State s;
  return s;
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
  if (level < s.level || s.level == Level::kOff) return;
  std::string text(message);
  if (once && !s.seen.insert(text).second) return;
  logger(s).log(to_spdlog(level), "{}", text);
  for (const auto& [id, callback] : s.callbacks)
    callback(level, text);
}

}  // namespace

void set_level(Level level) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().level = level;
}
Level level() {
  return state().level;
}
bool enabled(Level l) {
  return l >= state().level && state().level != Level::kOff;
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
