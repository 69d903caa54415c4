// The CUDA backend's environment switches, read the same way everywhere.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace vlac::cuda {

/// True when `name` is set to "0" (a switch that is on by default, turned off).
inline bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "0";
}

/// True when `name` is set to "1" (a switch that is off by default, turned on).
inline bool env_on(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "1";
}

/// `name`'s value, "" when unset.
inline std::string env_str(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::string(e) : std::string();
}

/// `name` as a non-negative integer; `dflt` when unset, empty or not one.
inline int64_t env_count(const char* name, int64_t dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  return (end && *end == '\0' && v >= 0) ? int64_t(v) : dflt;
}

}  // namespace vlac::cuda
