// OOM explanation: derived numbers and lever order. The lever table (order, changes_policy)
// follows the seed guide 004 "Fixing CUDA Out of Memory During VLA Training"; docs/mem-oom.md
// documents the table and the triggers.
#include "diag/oom_explain.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "core/bytes.h"

namespace vlac::diag {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
constexpr uint64_t kMinBlockSize = 512;     // round_size granularity
constexpr uint64_t kSmallSize = kMiB;       // largest "small" request
constexpr uint64_t kSmallBuffer = 2 * kMiB; // small-pool segment
constexpr uint64_t kMinLargeAlloc = 10 * kMiB;
constexpr uint64_t kLargeBuffer = 20 * kMiB;
constexpr uint64_t kRoundLarge = 2 * kMiB;

std::string hb(uint64_t b) { return format_bytes(b); }
std::string pct(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", r * 100.0);
  return buf;
}
uint64_t val(const std::optional<PrintedSize>& s) { return s ? s->bytes : 0; }
uint64_t unc(const std::optional<PrintedSize>& s) { return s ? s->uncertainty : 0; }

bool has_exceeds_warning(const OomMessage& m) {
  for (const auto& w : m.warnings)
    if (w.find("exceeds the total capacity") != std::string::npos) return true;
  return false;
}

std::string generation(const OomMessage& m) {
  switch (m.wording) {
    case OomWording::Mps:
      if (m.tried_to_allocate && m.tried_to_allocate->text.find("iB") == std::string::npos &&
          m.mps_allocated && m.mps_allocated->text.find("iB") == std::string::npos)
        return "mps-old-units";
      return "mps";
    case OomWording::Cached: return m.kind == OomKind::Xpu ? "ipex-xpu" : "1.0-1.3";
    case OomWording::ReservedTotal:
      if (m.kind == OomKind::Xpu) return "ipex-xpu";
      return m.hint_max_split ? "1.10-2.0" : "1.4-2.0";
    case OomWording::Sentence: break;
  }
  if (m.kind == OomKind::Xpu) return m.free ? "xpu" : "xpu-early";
  if (m.kind == OomKind::Hip) {
    if (m.hint_env_var == "PYTORCH_HIP_ALLOC_CONF") return "2.2-2.8 (rocm)";
    if (m.hint_env_var == "PYTORCH_CUDA_ALLOC_CONF") return "2.9+ (rocm)";
    if (m.hint_env_var == "PYTORCH_ALLOC_CONF") return "2.10+ (rocm)";
    return m.capacity_typo ? "2.1 (rocm)" : "2.2+ (rocm)";
  }
  if (m.capacity_typo || (m.hint_max_split && !m.hint_expandable)) return "2.1";
  if (m.hint_env_var == "PYTORCH_ALLOC_CONF") return "2.10";
  if (m.docs_url.find("docs.pytorch.org") != std::string::npos) return "2.11+";
  if (m.hint_env_var == "PYTORCH_CUDA_ALLOC_CONF" && !m.docs_url.empty()) return "2.2-2.9";
  return "2.2+";
}

struct LeverDef {
  const char* name;
  bool changes_policy;
};
// The guide's order. changes_policy: see docs/mem-oom.md ("which levers change the run").
constexpr std::array<LeverDef, 10> kGuideOrder = {{
    {"free_card", false},
    {"dtype", true},
    {"halve_batch", true},
    {"grad_accumulation", false},
    {"gradient_checkpointing", false},
    {"freeze", true},
    {"lora", true},
    {"shrink_inputs", true},
    {"allocator", false},
    {"bigger_card", false},
}};

}  // namespace

uint64_t caching_allocator_round_size(uint64_t request_bytes) {
  if (request_bytes < kMinBlockSize) return kMinBlockSize;
  uint64_t n = request_bytes / kMinBlockSize + (request_bytes % kMinBlockSize != 0);
  return n > UINT64_MAX / kMinBlockSize ? UINT64_MAX : n * kMinBlockSize;
}

uint64_t caching_allocator_segment_size(uint64_t rounded_bytes) {
  if (rounded_bytes <= kSmallSize) return kSmallBuffer;
  if (rounded_bytes < kMinLargeAlloc) return kLargeBuffer;
  uint64_t n = rounded_bytes / kRoundLarge + (rounded_bytes % kRoundLarge != 0);
  return n > UINT64_MAX / kRoundLarge ? UINT64_MAX : n * kRoundLarge;
}

OomExplanation explain_oom(const OomMessage& m) {
  OomExplanation ex;
  ex.warnings = m.warnings;
  ex.torch_generation = generation(m);
  const bool untrusted = has_exceeds_warning(m);
  const bool is_mps = m.kind == OomKind::Mps;
  const uint64_t cap = val(m.total_capacity);
  const uint64_t tried = val(m.tried_to_allocate);

  // ---- PyTorch's own pool ----
  if (m.wording == OomWording::ReservedTotal) {
    if (m.reserved_total) ex.reserved_bytes = m.reserved_total->bytes;
    if (m.reserved_total && m.allocated_by_pytorch) {
      if (m.reserved_total->bytes >= m.allocated_by_pytorch->bytes)
        ex.reserved_unallocated_bytes = m.reserved_total->bytes - m.allocated_by_pytorch->bytes;
      else if (m.allocated_by_pytorch->bytes - m.reserved_total->bytes >
               m.allocated_by_pytorch->uncertainty + m.reserved_total->uncertainty)
        ex.warnings.push_back("already allocated exceeds reserved in total: inconsistent figures");
      else
        ex.reserved_unallocated_bytes = 0;
    }
  } else if (!is_mps) {
    if (m.reserved_unallocated) ex.reserved_unallocated_bytes = m.reserved_unallocated->bytes;
    if (m.allocated_by_pytorch && m.reserved_unallocated)
      ex.reserved_bytes = m.allocated_by_pytorch->bytes + m.reserved_unallocated->bytes;
  }
  if (ex.reserved_bytes && ex.reserved_unallocated_bytes && *ex.reserved_bytes > 0)
    ex.fragmentation_ratio = static_cast<double>(*ex.reserved_unallocated_bytes) / static_cast<double>(*ex.reserved_bytes);

  // ---- processes (NVML lines) ----
  const OomProcess* self = nullptr;
  for (const auto& p : m.processes)
    if (p.is_self && p.used && p.used->bytes > 0) self = &p;
  if (!self && ex.reserved_bytes && !m.processes.empty()) {
    // In containers NVML's PIDs differ from getpid(): the caller shows up as "Process N". The
    // line whose usage is PyTorch's reserve plus a context-sized overhead is almost surely it.
    uint64_t slack = std::max<uint64_t>(2 * kGiB, cap / 20);
    uint64_t best_gap = UINT64_MAX;
    for (const auto& p : m.processes) {
      if (p.is_self || !p.used) continue;
      uint64_t u = p.used->bytes + p.used->uncertainty + kMiB;
      if (u < *ex.reserved_bytes) continue;
      uint64_t gap = u - *ex.reserved_bytes;
      if (gap <= slack && gap < best_gap) {
        best_gap = gap;
        self = &p;
      }
    }
    if (self) {
      ex.this_process_inferred = true;
      ex.notes.push_back("no 'this process' line: process " + std::to_string(self->pid.value_or(0)) +
                         " is read as this process (its usage matches PyTorch's reserve; NVML PIDs differ "
                         "inside containers)");
    }
  }
  if (self) ex.this_process_bytes = self->used->bytes;
  if (self && ex.reserved_bytes && !untrusted) {
    int64_t np = static_cast<int64_t>(self->used->bytes) - static_cast<int64_t>(*ex.reserved_bytes);
    int64_t tol = static_cast<int64_t>(self->used->uncertainty + unc(m.allocated_by_pytorch) +
                                       unc(m.reserved_unallocated) + unc(m.reserved_total) + 2 * kMiB);
    if (np < -tol) {
      ex.warnings.push_back("NVML's figure for this process (" + self->used->text +
                            ") is smaller than PyTorch's own reserve (" + hb(*ex.reserved_bytes) +
                            "): taken at another moment or for another PID; non-PyTorch memory unknown");
    } else {
      ex.non_pytorch_bytes = std::max<int64_t>(np, 0);
    }
  }
  bool any_listed = false;
  uint64_t others = 0, all_listed = 0, all_unc = 0;
  for (const auto& p : m.processes) {
    if (!p.used) continue;
    any_listed = true;
    all_listed += p.used->bytes;
    all_unc += p.used->uncertainty;
    if (&p != self && !(p.is_self)) others += p.used->bytes;
  }
  bool sentinel_self = false;
  for (const auto& p : m.processes)
    if (p.is_self && (!p.used || p.used->bytes == 0)) sentinel_self = true;
  // A paste cut inside the process list may hide more "Process N" lines.
  const bool list_complete = !m.truncated || m.allocated_by_pytorch.has_value();
  if (any_listed && !untrusted && list_complete) {
    ex.other_processes_bytes = others;
    if (m.total_capacity && m.free && !sentinel_self) {
      ex.unexplained_bytes = static_cast<int64_t>(cap) - static_cast<int64_t>(val(m.free)) - static_cast<int64_t>(all_listed);
      int64_t tol = static_cast<int64_t>(unc(m.total_capacity) + unc(m.free) + all_unc);
      if (*ex.unexplained_bytes < 0 && *ex.unexplained_bytes >= -tol) ex.unexplained_bytes = 0;
    }
  } else if (!untrusted && !is_mps && m.total_capacity && m.free && ex.reserved_bytes && !sentinel_self) {
    // No NVML lines (ROCm, Windows, 1.x wording): all we know is what is used outside the pool.
    int64_t outside = static_cast<int64_t>(cap) - static_cast<int64_t>(val(m.free)) - static_cast<int64_t>(*ex.reserved_bytes);
    if (outside >= 0) {
      ex.other_processes_bytes = static_cast<uint64_t>(outside);
      ex.other_processes_estimated = true;
    }
  }

  // ---- what "Tried to allocate" means ----
  if (m.tried_to_allocate) {
    uint64_t a = tried, u = m.tried_to_allocate->uncertainty;
    uint64_t lo = a > u ? a - u : 0, hi = a + u;
    if (is_mps) {
      ex.request_min_bytes = lo;
      ex.request_max_bytes = hi;
      ex.request_meaning = "the MPS buffer size after its heap alignment; the tensor is about this size";
    } else if (m.wording == OomWording::Cached) {
      ex.request_min_bytes = lo > kMinBlockSize ? lo - kMinBlockSize + 1 : 1;
      ex.request_max_bytes = hi;
      ex.request_meaning = "this (1.0-1.3) wording printed the request itself, rounded up to 512 bytes, "
                           "not a segment size";
    } else if (lo <= kSmallBuffer && kSmallBuffer <= hi) {
      ex.request_min_bytes = 1;
      ex.request_max_bytes = kSmallSize;
      ex.request_meaning = "a tensor of at most 1 MiB: the caching allocator serves requests <= 1 MiB from "
                           "2 MiB small-pool segments, and 2 MiB is the segment it could not get";
    } else if (lo <= kLargeBuffer && kLargeBuffer <= hi) {
      ex.request_min_bytes = kSmallSize + 1;
      ex.request_max_bytes = kMinLargeAlloc - 1;
      ex.request_meaning = "a tensor between 1 MiB and 10 MiB: such requests get a 20 MiB segment "
                           "(kLargeBuffer) that is then split, and 20 MiB is what it could not get";
    } else {
      uint64_t m_lo = (lo + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
      uint64_t m_hi = hi / kRoundLarge * kRoundLarge;
      if (m_lo <= m_hi && m_hi >= kMinLargeAlloc) {
        ex.request_min_bytes = std::max<uint64_t>(m_lo - kRoundLarge + 1, kMinLargeAlloc - kMinBlockSize + 1);
        ex.request_max_bytes = m_hi;
        ex.request_meaning = "requests of 10 MiB and more are rounded up to a multiple of 2 MiB, so the "
                             "tensor is up to 2 MiB smaller than printed: " +
                             hb(*ex.request_min_bytes) + " to " + hb(*ex.request_max_bytes);
      } else {
        ex.request_min_bytes = lo;
        ex.request_max_bytes = hi;
        ex.request_meaning = "not a segment size the caching allocator produces (those are 2 MiB, 20 MiB or "
                             "multiples of 2 MiB >= 10 MiB): the figure is the request itself (another "
                             "allocator backend such as cudaMallocAsync, or a custom one)";
      }
    }
  }

  // ---- allocator variable for this torch ----
  if (is_mps) {
    ex.allocator_env_var = "PYTORCH_MPS_HIGH_WATERMARK_RATIO";
    ex.allocator_setting = "a ratio above the default (1.7 on Apple silicon, at most 2.0); 0.0 removes the "
                           "cap and may freeze the machine";
  } else if (m.kind == OomKind::Xpu) {
    ex.allocator_env_var = "PYTORCH_ALLOC_CONF";
    ex.allocator_setting = "expandable_segments:True (device-generic settings, torch >= 2.9; older XPU builds "
                           "have none: call torch.xpu.empty_cache() between phases)";
  } else {
    if (!m.hint_env_var.empty()) ex.allocator_env_var = m.hint_env_var;
    else ex.allocator_env_var = m.kind == OomKind::Hip ? "PYTORCH_HIP_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
    if (m.wording == OomWording::Cached)
      ex.allocator_setting = "none in this torch (allocator settings arrived in 1.10, expandable_segments in "
                             "2.1): upgrade first";
    else if (m.wording == OomWording::ReservedTotal)
      ex.allocator_setting = "max_split_size_mb:512 (torch >= 1.10; expandable_segments:True needs torch >= 2.1)";
    else
      ex.allocator_setting = "expandable_segments:True";
  }

  // ---- levers ----
  const uint64_t free_b = val(m.free);
  const uint64_t alloc_b = val(m.allocated_by_pytorch);
  const uint64_t limit = m.allowed && m.allowed->bytes < cap ? m.allowed->bytes : cap;
  std::vector<std::pair<std::string, std::string>> pointed;  // name, why
  auto point = [&](const std::string& name, const std::string& why) {
    for (const auto& p : pointed)
      if (p.first == name) return;
    pointed.emplace_back(name, why);
  };
  std::vector<std::string> dropped;
  std::string free_card_why;

  // 1. A per-process cap, not the card, is the limit.
  if (!is_mps && m.allowed && m.total_capacity && m.allowed->bytes + m.allowed->uncertainty < cap &&
      tried <= cap && (free_b >= tried || alloc_b + tried > m.allowed->bytes)) {
    point("raise_memory_fraction", "a per-process cap of " + m.allowed->text + " is set (" +
                                       pct(static_cast<double>(m.allowed->bytes) / static_cast<double>(cap)) + " of the " +
                                       m.total_capacity->text + " card) and " + (m.free ? m.free->text : "?") +
                                       " is free on the device: the cap, not the card, is the limit");
  }
  // 2. Other processes hold memory.
  if (is_mps) {
    uint64_t other = val(m.mps_other);
    uint64_t maxa = val(m.mps_max_allowed);
    if (m.mps_other && other >= std::max<uint64_t>(kGiB, tried) && (maxa == 0 || other * 4 >= maxa))
      point("free_card", "other allocations hold " + m.mps_other->text + " of the " +
                             (m.mps_max_allowed ? m.mps_max_allowed->text : std::string("unified")) +
                             " limit: other apps and processes share the Mac's unified memory with PyTorch's " +
                             (m.mps_allocated ? m.mps_allocated->text : std::string("?")));
  } else if (ex.other_processes_bytes && !ex.other_processes_estimated) {
    uint64_t o = *ex.other_processes_bytes;
    if (o >= kGiB || (o >= 256 * kMiB && free_b + o >= tried)) {
      std::string list;
      int n = 0;
      for (const auto& p : m.processes) {
        if (&p == self || p.is_self || !p.used) continue;
        if (n++ < 4) list += (list.empty() ? "" : ", ") + std::string("pid ") + std::to_string(p.pid.value_or(0)) + " " + p.used->text;
      }
      if (n > 4) list += ", ...";
      point("free_card", std::to_string(n) + " other process" + (n == 1 ? "" : "es") + " hold " + hb(o) + " of the " +
                             (m.total_capacity ? m.total_capacity->text : std::string("?")) + " card (" + list +
                             "); without them " + hb(free_b + o) + " would be free against the " +
                             (m.tried_to_allocate ? m.tried_to_allocate->text : std::string("?")) + " request");
    }
  } else if (ex.other_processes_bytes && ex.other_processes_estimated) {
    uint64_t o = *ex.other_processes_bytes;
    if (o >= std::max<uint64_t>(2 * kGiB, cap / 10))
      point("free_card", hb(o) + " of the card is used outside PyTorch's pool (capacity - free - reserved; the "
                                 "message lists no processes, so this includes this process's CUDA context and "
                                 "the display): likely another process or a dead kernel");
  }
  // 3. One request larger than what the card (or the cap) can give.
  const bool request_too_big = m.tried_to_allocate && ((limit > 0 && tried > limit) ||
                                                        (is_mps && m.mps_max_allowed && tried > m.mps_max_allowed->bytes));
  if (request_too_big) {
    std::string card = is_mps ? (m.mps_max_allowed ? m.mps_max_allowed->text + " MPS limit" : "limit")
                              : (m.allowed && m.allowed->bytes < cap ? m.allowed->text + " cap" : m.total_capacity->text + " card");
    point("shrink_inputs", "one allocation of " + m.tried_to_allocate->text + " is larger than the whole " + card +
                               ": no allocator setting or freed memory makes it fit. Check the tensor's shape (a wrong "
                               "or unbatched dimension, attention over a too-long sequence, an op that must be "
                               "chunked), then shrink the input that sets it");
    point("halve_batch", "if that tensor scales with the batch, halving the batch halves it (" +
                             m.tried_to_allocate->text + " -> about " + hb(tried / 2) + ")");
    point("bigger_card", "a card with more than " + m.tried_to_allocate->text + " free is the only way to allocate " +
                             "this tensor unchanged");
    dropped = {"free_card", "allocator", "raise_memory_fraction"};
    pointed.erase(std::remove_if(pointed.begin(), pointed.end(),
                                 [](const auto& p) { return p.first == "free_card" || p.first == "raise_memory_fraction"; }),
                  pointed.end());
  }
  // 4. Memory in this process that PyTorch's allocator does not own.
  if (!request_too_big && ex.non_pytorch_bytes && static_cast<uint64_t>(*ex.non_pytorch_bytes) >= std::max<uint64_t>(2 * kGiB, cap / 10)) {
    point("free_card", "this process holds " + hb(static_cast<uint64_t>(*ex.non_pytorch_bytes)) +
                           " outside PyTorch's allocator (NVML's " + self->used->text + " minus PyTorch's " +
                           hb(ex.reserved_bytes.value_or(0)) + "). CUDA context plus cuBLAS/cuDNN workspaces are "
                           "usually 0.3-1 GiB; more means another allocator in the process (JAX preallocation, "
                           "TensorRT, cupy, NCCL buffers): release or cap it");
  }
  // 5. Fragmentation: memory reserved by PyTorch but trapped in partly used segments.
  if (!request_too_big && ex.reserved_unallocated_bytes && ex.fragmentation_ratio) {
    uint64_t r = *ex.reserved_unallocated_bytes;
    double fr = *ex.fragmentation_ratio;
    if ((r >= kGiB && (r >= tried || fr >= 0.2)) || (r >= 256 * kMiB && r >= tried && fr >= 0.1)) {
      std::string why = hb(r) + " is reserved by PyTorch but unallocated (" + pct(fr) + " of its " +
                        hb(ex.reserved_bytes.value_or(0)) + " pool)";
      if (r >= tried)
        why += ", more than the " + m.tried_to_allocate->text + " request: it would fit if that memory were contiguous";
      else
        why += "; even defragmented, free + unallocated = " + hb(free_b + r) + " against the " +
               m.tried_to_allocate->text + " request, so also shrink what the step needs";
      why += ". The allocator already released every unsplit cached block before raising, so this is "
             "fragmentation, not cache that empty_cache() would free";
      if (m.hint_expandable)
        why += ". The message prints its hint even when expandable segments are already on "
               "(pytorch/pytorch#173049): check torch.cuda.memory._snapshot()['allocator_settings']";
      point("allocator", why);
    }
  }

  auto default_why = [&](const std::string& name) -> std::string {
    if (name == "free_card") {
      if (is_mps) return "close other apps that use GPU memory; MPS shares the Mac's unified memory";
      if (ex.other_processes_bytes && !ex.other_processes_estimated && *ex.other_processes_bytes == 0) {
        if (ex.non_pytorch_bytes && *ex.non_pytorch_bytes > 0)
          return "NVML lists no other process; this process holds " + hb(static_cast<uint64_t>(*ex.non_pytorch_bytes)) +
                 " outside PyTorch's pool (CUDA context, cuBLAS/cuDNN workspaces, other libraries)";
        return "NVML lists no other process on this card; only stale kernels of your own would show up here";
      }
      if (ex.other_processes_bytes)
        return (ex.other_processes_estimated ? "about " : "") + hb(*ex.other_processes_bytes) +
               " is used outside this process's PyTorch pool; a dead notebook kernel or crashed run can sit on GBs";
      return "a dead notebook kernel or a crashed run can sit on GBs; check before changing anything";
    }
    if (name == "dtype")
      return "PyTorch holds " + (m.allocated_by_pytorch ? m.allocated_by_pytorch->text : (m.mps_allocated ? m.mps_allocated->text : std::string("its tensors"))) +
             "; fp32 weights and activations take twice the bytes of bf16 (lerobot's pi0/pi05 default dtype is "
             "float32 and accelerate's mixed_precision defaults to no)";
    if (name == "halve_batch")
      return "activations scale with the batch: if half the batch runs, activations dominate; if batch 1 still "
             "fails, weights, gradients and optimizer state do (go to freeze/LoRA)";
    if (name == "grad_accumulation")
      return "accumulating 2 micro-batches restores the effective batch after halving it; memory stays at the "
             "micro-batch, time doubles";
    if (name == "gradient_checkpointing")
      return "drops saved activations and recomputes them in the backward pass (~20-30% slower), the same math";
    if (name == "freeze")
      return "frozen modules need no gradients and no optimizer state (mixed-precision AdamW: ~12 of its 16-18 "
             "bytes per trainable parameter)";
    if (name == "lora")
      return "adapters cut gradients and optimizer state to the adapter parameters; the backbone stays frozen";
    if (name == "shrink_inputs")
      return "fewer cameras, smaller images or shorter action chunks cut activations hard, and change the task";
    if (name == "allocator") {
      if (ex.reserved_unallocated_bytes)
        return "costs nothing; " + hb(*ex.reserved_unallocated_bytes) + " is reserved but unallocated here, so " +
               "expect at most that much back";
      return "costs nothing; reduces fragmentation when the reserved-but-unallocated figure is large";
    }
    if (name == "bigger_card") {
      uint64_t need = alloc_b + tried + (ex.non_pytorch_bytes ? static_cast<uint64_t>(*ex.non_pytorch_bytes) : 0);
      if (is_mps) need = val(m.mps_allocated) + tried;
      uint64_t have = is_mps ? val(m.mps_max_allowed) : cap;
      if (need > 0 && have > 0) {
        std::string s = "this step needs at least " + hb(need) + " (allocated + request" +
                        (ex.non_pytorch_bytes ? std::string(" + non-PyTorch") : std::string()) + ") against " +
                        (is_mps ? m.mps_max_allowed->text : m.total_capacity->text);
        if (need <= have && !untrusted)
          return s + ": the card is big enough in principle, so the free levers above come first";
        return s + "; price a few hours on the next tier before trading accuracy";
      }
      return "price a few hours on the next tier before trading accuracy";
    }
    return "";
  };
  auto how = [&](const std::string& name) -> std::string {
    if (name == "free_card") {
      if (is_mps) return "quit other GPU-heavy apps (Activity Monitor > GPU); restart the Python process";
      if (m.kind == OomKind::Hip) return "rocm-smi --showpids; kill only processes you recognise as yours";
      if (m.kind == OomKind::Xpu) return "xpu-smi ps; kill only processes you recognise as yours";
      return "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; kill -9 <pid> (only yours)";
    }
    if (name == "dtype") return "lerobot-train --policy.dtype=bfloat16 ... or --accelerator.mixed_precision=bf16";
    if (name == "halve_batch") return "lerobot-train --batch_size=<half> ... (GR00T: --global-batch-size <half>)";
    if (name == "grad_accumulation")
      return "lerobot-train --accelerator.gradient_accumulation.steps=2 ... (GR00T: --gradient-accumulation-steps 2)";
    if (name == "gradient_checkpointing")
      return "lerobot-train --policy.gradient_checkpointing=true ... (raw PyTorch: checkpoint(block, x, use_reentrant=False))";
    if (name == "freeze") return "lerobot-train --policy.freeze_vision_encoder=true --policy.train_expert_only=true ...";
    if (name == "lora") return "lerobot-train --peft.method_type=LORA --peft.r=16 --peft.lora_alpha=32 ...";
    if (name == "shrink_inputs") return "lerobot-train --policy.chunk_size=25 --policy.n_action_steps=25 ... (or fewer cameras / smaller images)";
    if (name == "allocator") {
      if (is_mps) return "export PYTORCH_MPS_HIGH_WATERMARK_RATIO=<higher ratio> (0.0 removes the limit; may cause system failure)";
      if (m.kind == OomKind::Xpu) return "export PYTORCH_ALLOC_CONF=expandable_segments:True (if your build supports it); torch.xpu.empty_cache()";
      if (m.wording == OomWording::Cached) return "upgrade torch (>= 2.1) for " + ex.allocator_env_var + "=expandable_segments:True";
      if (m.wording == OomWording::ReservedTotal) return "export " + ex.allocator_env_var + "=max_split_size_mb:512";
      std::string s = "export " + ex.allocator_env_var + "=expandable_segments:True";
      if (ex.allocator_env_var == "PYTORCH_ALLOC_CONF")
        s += " (on 2.9.x also set PYTORCH_CUDA_ALLOC_CONF: the new name was ignored for CUDA there, pytorch/pytorch#183387)";
      return s;
    }
    if (name == "bigger_card") return "80 GB tier (A100/H100) for pi0.5 and GR00T full fine-tunes; 24 GB is enough for SmolVLA and ACT";
    if (name == "raise_memory_fraction") {
      if (m.kind == OomKind::Xpu) return "torch.xpu.set_per_process_memory_fraction(<higher>) or remove the call";
      return "torch.cuda.set_per_process_memory_fraction(<higher>) or remove it (also per_process_memory_fraction in " +
             ex.allocator_env_var + ")";
    }
    return "";
  };
  auto policy = [](const std::string& name) {
    for (const auto& d : kGuideOrder)
      if (name == d.name) return d.changes_policy;
    return false;  // raise_memory_fraction
  };
  auto is_dropped = [&](const std::string& name) {
    return std::find(dropped.begin(), dropped.end(), name) != dropped.end();
  };
  for (const auto& [name, why] : pointed) {
    OomLever l;
    l.name = name;
    l.why = why;
    l.how = how(name);
    l.changes_policy = policy(name);
    l.pointed = true;
    ex.levers.push_back(std::move(l));
  }
  for (const auto& d : kGuideOrder) {
    std::string name = d.name;
    if (is_dropped(name)) continue;
    bool already = false;
    for (const auto& l : ex.levers) already |= (l.name == name);
    if (already) continue;
    if (name == "free_card" && ex.other_processes_bytes && !ex.other_processes_estimated && *ex.other_processes_bytes == 0 &&
        !(ex.non_pytorch_bytes && *ex.non_pytorch_bytes >= static_cast<int64_t>(kGiB)))
      continue;  // NVML shows the card is ours alone: nothing to free
    OomLever l;
    l.name = name;
    l.why = default_why(name);
    l.how = how(name);
    l.changes_policy = d.changes_policy;
    ex.levers.push_back(std::move(l));
  }
  (void)free_card_why;

  // ---- notes ----
  if (m.n_messages > 1)
    ex.notes.push_back(std::to_string(m.n_messages) + " out-of-memory messages in the input; this is the first" +
                       (m.messages_differ ? " (the others have different numbers)" : " (the others repeat it)"));
  if (untrusted)
    ex.notes.push_back("figures exceed the card, so the derived numbers that compare with the capacity are left out");
  if (m.kind == OomKind::Xpu && m.tried_to_allocate && tried > 4 * kGiB && free_b >= tried)
    ex.notes.push_back("the request is over 4 GiB while " + (m.free ? m.free->text : std::string("enough")) +
                       " is free: many Intel GPUs refuse a single allocation above 4 GiB unless relaxed "
                       "allocation limits are enabled, so split the tensor");
  if (m.kind == OomKind::Hip && m.processes.empty())
    ex.notes.push_back("ROCm builds print no per-process lines; 'other processes' is an estimate");
  return ex;
}

}  // namespace vlac::diag
