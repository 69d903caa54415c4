// Renders a SnapshotAnalysis as text for people, JSON (exact bytes) and one self-contained HTML
// page (inline SVG timeline, no scripts, no network). Must not do I/O: callers write the strings.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "diag/snapshot_analysis.h"

namespace vlac {

/// Human report; `label` names the snapshot (usually the file path).
std::string snapshot_text(const SnapshotAnalysis& a, const std::string& label);

/// JSON keys: file, device, has_trace, shape, peak_allocated_bytes, peak_event, parts
/// {flat_bytes, sawtooth_bytes, staircase_bytes}, leak {...}, top_sites [...], levers [...],
/// oom {...}|null, timeline {...}, steps [...], notes [...].
nlohmann::json snapshot_json(const SnapshotAnalysis& a, const std::string& label);

/// A complete HTML document; every string taken from the snapshot is escaped.
std::string snapshot_html(const SnapshotAnalysis& a, const std::string& label);

}  // namespace vlac
