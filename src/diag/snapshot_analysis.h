// Turns a decoded CUDA memory snapshot into a diagnosis: allocated/reserved bytes over time,
// the peak split into flat / sawtooth / staircase, top allocation sites, levers. Pure function
// of SnapshotData: no I/O, no recursion, linear-ish in the number of trace events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "diag/snapshot_data.h"

namespace vlac {

struct SnapshotOptions {
  int device = -1;              // -1: the device with the most trace events
  size_t top_sites = 8;         // sites listed
  size_t plot_sites = 6;        // sites stacked in the timeline (the rest is "other")
  size_t timeline_points = 600;  // samples of the timeline (max-preserving)
};

/// What a byte alive at the peak is, by when it was allocated and freed:
/// Flat      = alive from (before) the first step to past the peak (weights, optimizer state).
/// Sawtooth  = allocated and freed within about a step (activations, gradients, temporaries).
/// Staircase = never freed and added again in step after step from the same site (a leak).
enum class MemPart : uint8_t { Flat, Sawtooth, Staircase };
const char* to_string(MemPart p);

struct SnapshotSite {
  std::string site;      // "make_memory_snapshots.py:72 leaky_train_step" (first user frame)
  std::string filename;  // full path of that frame ("" when there is no stack)
  int64_t line = 0;
  std::string function;
  std::string call_chain;  // up to 4 user frames, innermost first: "f <- g <- main"
  uint64_t bytes = 0;      // alive at the peak
  uint64_t count = 0;
  uint64_t part_bytes[3] = {0, 0, 0};  // by MemPart
  MemPart dominant = MemPart::Flat;
};

struct SnapshotStep {
  size_t begin_event = 0;  // first event of the step
  size_t end_event = 0;    // one past the last
  uint64_t start_bytes = 0;
  uint64_t end_bytes = 0;
  uint64_t peak_bytes = 0;
};

struct SnapshotOom {
  size_t event = 0;
  size_t step = 0;
  uint64_t requested_bytes = 0;
  uint64_t device_free_bytes = 0;
  uint64_t allocated_bytes = 0;  // at that moment (reconstructed)
  uint64_t reserved_bytes = 0;
  std::string site;
  size_t n_ooms = 0;
};

struct SnapshotLever {
  std::string part;  // "staircase", "flat", "sawtooth", "fragmentation"
  std::string name;
  std::string why;
  bool changes_policy = false;
};

struct SnapshotTimelinePoint {
  int64_t event = -1;  // -1 = before the first recorded event
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  std::vector<uint64_t> by_site;  // parallel to SnapshotAnalysis::timeline_sites
};

struct SnapshotAnalysis {
  int device = 0;
  bool has_trace = false;
  size_t n_events = 0;
  size_t n_allocs = 0;
  size_t n_frees = 0;
  size_t n_segments = 0;
  int64_t first_time_us = -1;
  int64_t last_time_us = -1;

  // Reconstructed series (trace) or the dump state (segments only).
  uint64_t allocated_start = 0;
  uint64_t reserved_start = 0;
  uint64_t allocated_end = 0;
  uint64_t reserved_end = 0;
  uint64_t peak_allocated = 0;
  int64_t peak_event = -1;
  uint64_t reserved_at_peak = 0;
  uint64_t peak_reserved = 0;
  uint64_t pre_recording_bytes = 0;  // allocations alive before the first recorded event

  // The peak, split (sums to peak_allocated when has_trace).
  uint64_t part_bytes[3] = {0, 0, 0};
  // The leak, measured at the end of the trace.
  uint64_t leak_bytes_end = 0;
  size_t leak_steps = 0;
  uint64_t leak_bytes_per_step = 0;
  std::string leak_site;

  std::string shape = "unknown";  // flat | sawtooth | staircase | unknown
  std::string step_source = "none";
  std::vector<SnapshotStep> steps;
  size_t peak_step = 0;

  std::vector<SnapshotSite> top_sites;
  std::optional<SnapshotOom> oom;
  std::vector<SnapshotLever> levers;
  std::vector<std::string> notes;

  std::vector<std::string> timeline_sites;
  std::vector<SnapshotTimelinePoint> timeline;

  // The segments at the moment of the dump.
  uint64_t dump_reserved = 0;
  uint64_t dump_allocated = 0;  // active_allocated + active_pending_free blocks
  bool expandable_segments = false;
  size_t n_inconsistent = 0;  // frees without a matching alloc, double allocs
};

/// Analyses one device of the snapshot. InvalidArgument if `opts.device` does not exist.
Result<SnapshotAnalysis> analyze_snapshot(const SnapshotData& data, const SnapshotOptions& opts = {});

/// "file.py:12 fn" for the first frame that is not PyTorch / CPython / C++ internals,
/// or "" when the stack has none. Exposed for tests.
bool is_internal_frame(const SnapshotFrame& f);

}  // namespace vlac
