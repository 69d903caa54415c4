// `vlac inspect OUT.vlac [--verify] [--json]`: the package branch of cmd_inspect.cpp.
// Reads the package's header, table and manifest; --verify streams every segment checksum.
#pragma once

#include <string>

#include "core/status.h"
#include "mem/meter.h"

namespace vlac::cli {

/// Prints engines, segments, crossing values and totals of the package at `path` (tables, or
/// one JSON object with exact bytes when `json`). With `verify`, checks every checksum first
/// and returns the mismatch (InvalidFormat, exit 2) after printing the listing.
Status inspect_package(const std::string& path, bool verify, bool json, MemMeter& meter);

}  // namespace vlac::cli
