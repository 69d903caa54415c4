// The records of a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot), decoded
// from a PickleDoc into plain structs. Version-tolerant: unknown keys are ignored, every key but
// `segments` is optional, both block-state spellings and legacy `history` blocks are understood.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "diag/pickle_reader.h"

namespace vlac {

struct SnapshotFrame {
  std::string filename;
  int64_t line = 0;
  std::string name;
};

enum class BlockState : uint8_t { ActiveAllocated, ActivePendingFree, Inactive, Unknown };

struct SnapshotBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  BlockState state = BlockState::Unknown;
  int32_t stack = -1;  // index into SnapshotData::stacks, -1 = no frames
};

struct SnapshotSegment {
  int64_t device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  bool is_expandable = false;
  bool private_pool = false;  // segment_pool_id != (0, 0): CUDA graph / MemPool
  std::string segment_type;   // "small" / "large"
  std::vector<SnapshotBlock> blocks;
};

enum class TraceAction : uint8_t {
  Alloc,
  FreeRequested,
  FreeCompleted,
  SegmentAlloc,
  SegmentFree,
  SegmentMap,
  SegmentUnmap,
  Snapshot,
  Oom,
  Other,  // user_defined, annotate and anything newer
};

struct TraceEvent {
  TraceAction action = TraceAction::Other;
  uint64_t addr = 0;         // for Oom: 0
  uint64_t size = 0;         // for Oom: the requested bytes
  uint64_t device_free = 0;  // Oom only: what CUDA reported free
  int64_t time_us = -1;      // -1 = absent (torch < 2.2)
  int32_t stack = -1;
};

struct SnapshotAnnotation {
  std::string name;   // "ProfilerStep#3", "Optimizer.step#AdamW.step", ...
  std::string stage;  // "START" / "END"
  int64_t device = -1;
  int64_t time_us = -1;
};

struct SnapshotData {
  std::vector<SnapshotSegment> segments;
  bool has_trace_key = false;                    // `device_traces` present at all
  std::vector<std::vector<TraceEvent>> traces;   // indexed by device
  std::vector<SnapshotAnnotation> annotations;
  std::vector<std::vector<SnapshotFrame>> stacks;  // interned frame lists (innermost first)
  bool expandable_segments = false;
  std::string alloc_conf;  // allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]
  bool legacy_segment_list = false;  // torch 1.x: the root was the segment list itself
  size_t n_unknown_actions = 0;
  size_t n_opaque_values = 0;  // pickled class references / reduce calls seen (never executed)
};

/// Reads the snapshot tree. Bad shapes (root not a dict/list, `segments` not a list, a segment
/// that is not a dict) are InvalidFormat naming the key and index.
Result<SnapshotData> decode_snapshot(const PickleDoc& doc);

/// Maps and decodes a snapshot file (plain, or xz-compressed when built with liblzma); errors
/// name the file.
Result<SnapshotData> load_snapshot_file(const std::string& path, const PickleLimits& limits = {});

const char* to_string(TraceAction a);

}  // namespace vlac
