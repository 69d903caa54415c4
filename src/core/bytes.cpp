// Byte-size formatting and parsing.
#include "core/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace vlac {

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) { v /= 1024.0; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string format_bytes_signed(int64_t bytes) {
  uint64_t mag = bytes < 0 ? static_cast<uint64_t>(-(bytes + 1)) + 1 : static_cast<uint64_t>(bytes);
  std::string out(1, bytes < 0 ? '-' : '+');
  out.append(format_bytes(mag));
  return out;
}

Result<uint64_t> parse_size(std::string_view text) {
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return invalid_argument("not a size: '" + s + "' (expected e.g. 512MiB or 2GiB)");
  std::string num = s.substr(0, i);
  std::string unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else return invalid_argument("unknown size unit in '" + s + "' (use B, KiB, MiB, GiB or TiB)");
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v))
    return invalid_argument("not a size: '" + s + "'");
  double bytes = v * mult;
  if (bytes >= 18446744073709551615.0) return invalid_argument("size too large: '" + s + "'");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_duration(double seconds) {
  char buf[48];
  if (seconds < 1.0) std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1000.0);
  else if (seconds < 60.0) std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  else {
    long s = std::lround(seconds);
    std::snprintf(buf, sizeof buf, "%ld min %02ld s", s / 60, s % 60);
  }
  return buf;
}

}  // namespace vlac
