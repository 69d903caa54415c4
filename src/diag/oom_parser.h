// Reader for PyTorch's out-of-memory messages (CUDA/HIP/XPU caching allocator, MPS allocator),
// every wording generation, out of pasted logs. It only extracts what the message prints; it
// must not guess what the numbers mean (oom_explain does that) and must never crash on any input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace vlac::diag {

enum class OomKind { Cuda, Hip, Xpu, Mps };
/// "cuda", "hip", "xpu", "mps".
const char* to_string(OomKind kind);

/// A size exactly as PyTorch printed it ("2.34 GiB") and its byte value. PyTorch prints two
/// decimals of a 1024-based unit, so the true value lies within +-`uncertainty` of `bytes`.
struct PrintedSize {
  uint64_t bytes = 0;        // value * unit, rounded to the nearest byte
  uint64_t uncertainty = 0;  // half of the last printed digit, in bytes (0 for "bytes")
  std::string text;          // "2.34 GiB"
};

/// One NVML line: "Process N has X memory in use." or, for the caller itself,
/// "Including non-PyTorch memory, this process has X memory in use."
struct OomProcess {
  std::optional<uint64_t> pid;        // nullopt for the "this process" line
  std::optional<PrintedSize> used;    // nullopt when the printed value is impossible (2^64 sentinel)
  std::string used_text;              // as printed, even when `used` was rejected
  bool is_self = false;
};

/// Wording generation of the caching allocator's message (decides field meanings and which
/// allocator variable the user's torch understands).
enum class OomWording {
  Cached,          // 1.0-1.3: "(GPU n; T total capacity; A already allocated; F free; C cached)"
  ReservedTotal,   // 1.4-2.0: "...; R reserved in total by PyTorch)"
  Sentence,        // 2.1+:   "GPU n has a total capac(i)ty of T of which F is free. ..."
  Mps,             // "MPS backend out of memory (MPS allocated: ..."
};

struct OomMessage {
  OomKind kind = OomKind::Cuda;
  bool kind_assumed = false;         // header cut off; "(GPU n; ...)" shape implies CUDA
  OomWording wording = OomWording::Sentence;
  std::string exception_type;        // "torch.OutOfMemoryError", "RuntimeError", ... or ""
  std::optional<int> device;         // "GPU n"

  std::optional<PrintedSize> tried_to_allocate;
  std::optional<PrintedSize> total_capacity;
  std::optional<PrintedSize> free;
  std::optional<PrintedSize> allowed;              // "X allowed;" (memory fraction cap)
  std::optional<PrintedSize> allocated_by_pytorch; // 2.x "is allocated by PyTorch" / 1.x "already allocated"
  std::optional<PrintedSize> private_pools;        // "with X allocated in private pools"
  std::optional<PrintedSize> reserved_unallocated; // 2.x "is reserved by PyTorch but unallocated" / 1.0 "cached"
  std::optional<PrintedSize> reserved_total;       // 1.4-2.0 "reserved in total by PyTorch"
  std::vector<OomProcess> processes;               // in printed (NVML) order

  // MPS
  std::optional<PrintedSize> mps_allocated;
  std::optional<PrintedSize> mps_other;
  std::optional<PrintedSize> mps_max_allowed;
  std::string mps_pool;                            // "private" | "shared" | ""

  // Hints and their spelling.
  bool hint_max_split = false;       // "... try setting max_split_size_mb ..."
  bool hint_expandable = false;      // "... try setting <ENV>=expandable_segments:True ..."
  bool hint_empty_cache = false;     // XPU "Please use `empty_cache` ..."
  bool hint_mps_watermark = false;   // "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 ..."
  bool graphs_hip = false;           // private pools "(e.g., HIP Graphs)"
  bool capacity_typo = false;        // 2.1's "total capacty"
  std::string hint_env_var;          // PYTORCH_CUDA_ALLOC_CONF | PYTORCH_HIP_ALLOC_CONF | PYTORCH_ALLOC_CONF
  std::string docs_url;              // the documentation link, when printed

  bool truncated = false;            // the paste ends before the message does
  std::string truncated_after;       // the last part read before the cut
  size_t n_messages = 1;             // OOM messages in the input (this is the first one)
  bool messages_differ = false;      // some later message has other numbers
  std::vector<std::string> warnings; // impossible or untrustworthy values, cuts, assumptions
};

/// Parses the first PyTorch OOM message in `text` (a whole log is fine: timestamps, `[rankN]:`
/// prefixes, tracebacks, markdown, HTML entities and wrapped lines are tolerated). `source` names
/// the input in errors ("-" for stdin). Linear in the input size; never crashes.
/// @returns InvalidFormat "no PyTorch out-of-memory message found in <source>" when there is none.
Result<OomMessage> parse_oom(std::string_view text, const std::string& source);

/// Parses one size as PyTorch prints it ("812.00 MiB", "0 bytes", "9.07 GB"); whitespace between
/// number and unit optional. nullopt when it is not a size or overflows 64 bits.
std::optional<PrintedSize> parse_printed_size(std::string_view text);

/// The joined, prefix-stripped, whitespace-collapsed text the parser matches on (exposed for tests).
std::string normalize_log_text(std::string_view text);

}  // namespace vlac::diag
