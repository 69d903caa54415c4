// What an OOM message means: the numbers PyTorch never prints (real request size, other
// processes, non-PyTorch memory, fragmentation) and the guide's levers, the one the numbers
// point to first. Pure arithmetic on a parsed OomMessage; no I/O, never trusts impossible values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diag/oom_parser.h"

namespace vlac::diag {

/// One remedy. `changes_policy` is true when pulling it changes what the trained policy learns
/// (so two checkpoints are no longer comparable); see docs/mem-oom.md for the table and why.
struct OomLever {
  std::string name;     // free_card, dtype, halve_batch, grad_accumulation, gradient_checkpointing,
                        // freeze, lora, shrink_inputs, allocator, bigger_card, raise_memory_fraction
  std::string why;      // with the message's numbers
  std::string how;      // a command or setting
  bool changes_policy = false;
  bool pointed = false; // moved to the front because the numbers point at it
};

struct OomExplanation {
  std::optional<uint64_t> reserved_bytes;            // allocated by PyTorch + reserved-but-unallocated
  std::optional<uint64_t> reserved_unallocated_bytes;// printed (2.x, "cached") or derived (1.4-2.0)
  std::optional<uint64_t> this_process_bytes;        // NVML's figure for this process
  bool this_process_inferred = false;                // taken from a "Process N" line (container PIDs)
  std::optional<int64_t> non_pytorch_bytes;          // this process - reserved (context, cuBLAS, NCCL, other allocators)
  std::optional<uint64_t> other_processes_bytes;     // sum of the other processes' lines
  bool other_processes_estimated = false;            // no NVML lines: capacity - free - reserved (upper bound)
  std::optional<int64_t> unexplained_bytes;          // capacity - free - all listed processes
  std::optional<double> fragmentation_ratio;         // reserved-but-unallocated / reserved
  // What "Tried to allocate" says about the tensor that failed.
  std::optional<uint64_t> request_min_bytes;
  std::optional<uint64_t> request_max_bytes;
  std::string request_meaning;
  std::string torch_generation;                      // "1.0-1.3", "1.4-1.9", "1.10-2.0", "2.1", "2.2-2.9", ...
  std::string allocator_env_var;                     // the variable this torch reads
  std::string allocator_setting;                     // "expandable_segments:True" or a fallback
  std::vector<OomLever> levers;                      // ordered: pointed first, then the guide's order
  std::vector<std::string> notes;                    // derived observations (not warnings)
  std::vector<std::string> warnings;                 // parser warnings + inconsistencies found here
};

/// Derives the numbers and orders the levers.
OomExplanation explain_oom(const OomMessage& msg);

/// Caching-allocator sizing (c10/cuda/CUDACachingAllocator.cpp): round_size() rounds a request
/// up to a multiple of 512 B (minimum 512 B); get_allocation_size() turns it into the segment
/// size the allocator asks the driver for: <= 1 MiB -> 2 MiB, < 10 MiB -> 20 MiB, else a
/// multiple of 2 MiB. "Tried to allocate" prints that segment size (since the 1.4-era wording).
uint64_t caching_allocator_round_size(uint64_t request_bytes);
uint64_t caching_allocator_segment_size(uint64_t rounded_bytes);

/// The report as JSON (exact bytes; null where unknown or rejected).
std::string oom_report_json(const OomMessage& msg, const OomExplanation& ex);
/// The report for people (human sizes, a small table, warnings, numbered levers).
std::string oom_report_text(const OomMessage& msg, const OomExplanation& ex);

}  // namespace vlac::diag
