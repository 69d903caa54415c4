// Byte sizes for people: 1024-based formatting ("41.2 MiB") and parsing ("512MiB", "2GiB", "4G").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace vlac {

/// "0 B", "812 B", "41.2 MiB", "1.50 GiB" (1024-based).
std::string format_bytes(uint64_t bytes);
/// Same for a signed delta: "+38.0 MiB", "-1.0 KiB".
std::string format_bytes_signed(int64_t bytes);
/// Parses "123", "64KiB", "512MiB", "2GiB", "1.5G", "10MB" (MB/GB are also 1024-based, as most
/// tools treat them). Rejects negatives, overflow and unknown units.
Result<uint64_t> parse_size(std::string_view text);
/// "12.3 s", "450 ms", "1 min 02 s".
std::string format_duration(double seconds);

/// a*b with overflow detection; returns false on overflow.
inline bool mul_overflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
inline bool add_overflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace vlac
