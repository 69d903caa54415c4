// Strict JSON reading for hostile files (index json, config.json): bounded size and depth,
// UTF-8 checked byte by byte, duplicate keys rejected (nlohmann would silently keep one).
// Never throws; every problem is a Status naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace vlac {

/// Largest JSON side file (index json, config.json) we read.
inline constexpr uint64_t kJsonMaxFileBytes = 100'000'000;

/// True if [data, data+size) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
/// On failure, *bad_offset (if given) receives the offset of the first bad byte.
bool is_valid_utf8(const uint8_t* data, size_t size, size_t* bad_offset = nullptr);

/// A one-line, bounded rendering of untrusted text for error messages: control bytes and
/// invalid UTF-8 become \xNN, and the result is cut to about `max_bytes` with "...".
std::string printable(std::string_view text, size_t max_bytes = 120);

/// Parses JSON text strictly: valid UTF-8, no duplicate keys in any object, at most
/// `max_depth` nested containers, nothing but whitespace after the value. `path` names the
/// source in error messages (InvalidFormat).
Result<nlohmann::json> parse_json_strict(const uint8_t* data, size_t size, const std::string& path,
                                         int max_depth = 64);

/// Reads and parses a JSON file of at most `max_bytes` (see parse_json_strict).
Result<nlohmann::json> read_json_file(const std::string& path, uint64_t max_bytes = kJsonMaxFileBytes,
                                      int max_depth = 64);

/// Text of a nlohmann parse error without its "[json.exception...]" prefix, made printable.
std::string json_error_text(const std::exception& ex);

}  // namespace vlac
