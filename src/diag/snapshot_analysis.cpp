// Snapshot analysis. Method (see docs/mem-snapshot.md):
//  1. live set before recording = blocks alive at the dump, walked BACKWARDS through the trace
//     (an alloc removes its block, a free_completed adds one); reserved before recording =
//     reserved at the dump - segment_alloc/map + segment_free/unmap of the trace.
//  2. replay forwards: alloc +size, free_completed -size (free_requested is not counted, as in
//     PyTorch's viewer), segment_* for reserved; every allocation becomes a record [alloc, free).
//  3. steps from ProfilerStep / optimizer.step() annotations, else from the period of the
//     sequence of allocation sites; each record alive at the peak is classified flat, sawtooth
//     or staircase by the steps it was allocated and freed in.
#include "diag/snapshot_analysis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "core/bytes.h"

namespace vlac {

namespace {

constexpr int64_t kBefore = -1;  // alloc_ev of allocations made before recording

// The caching allocator hands out blocks rounded up to 512 bytes (kMinBlockSize, round_size()
// without roundup_power2_divisions); trace entries carry the requested size. Allocated bytes
// are counted as PyTorch's memory_allocated() counts them: rounded.
uint64_t block_size(uint64_t requested) { return requested < 512 ? 512 : (requested + 511) / 512 * 512; }

struct Rec {
  uint64_t size = 0;
  int64_t alloc_ev = kBefore;
  int64_t free_ev = 0;  // n_events = never freed in the trace
  int32_t stack = -1;
  uint32_t site = 0;
  MemPart part = MemPart::Flat;
};

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }
bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::string basename_of(const std::string& path) {
  size_t slash = path.find_last_of("/\\");
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string pct(uint64_t part, uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

// Sites: interned strings with their frame details.
struct SiteTable {
  std::vector<SnapshotSite> sites;
  std::unordered_map<std::string, uint32_t> index;
  std::unordered_map<int32_t, uint32_t> by_stack;

  uint32_t intern(const SnapshotSite& s) {
    auto it = index.find(s.site);
    if (it != index.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(sites.size());
    sites.push_back(s);
    index.emplace(s.site, id);
    return id;
  }
  uint32_t of_stack(const SnapshotData& d, int32_t stack, bool before_recording) {
    if (stack < 0 || static_cast<size_t>(stack) >= d.stacks.size() || d.stacks[stack].empty()) {
      SnapshotSite s;
      s.site = before_recording ? "<allocated before recording: no stack>" : "<no Python stack: backward pass or C++>";
      return intern(s);
    }
    auto it = by_stack.find(stack);
    if (it != by_stack.end()) return it->second;
    const auto& frames = d.stacks[stack];
    SnapshotSite s;
    const SnapshotFrame* first = nullptr;
    int chain = 0;
    for (const SnapshotFrame& f : frames) {
      if (is_internal_frame(f)) continue;
      if (!first) first = &f;
      if (chain < 4) {
        if (chain) s.call_chain += " <- ";
        s.call_chain += f.name;
        ++chain;
      }
    }
    if (!first) first = &frames.front();  // only internals: name the innermost
    s.filename = first->filename;
    s.line = first->line;
    s.function = first->name;
    s.site = basename_of(first->filename) + ":" + std::to_string(first->line) + " " + first->name;
    uint32_t id = intern(s);
    by_stack.emplace(stack, id);
    return id;
  }
};

// Step boundaries (event indices where a new step begins) from annotations.
std::vector<size_t> steps_from_annotations(const SnapshotData& d, int device, const std::vector<TraceEvent>& ev,
                                           std::string* source) {
  for (const TraceEvent& e : ev)
    if (e.time_us < 0) return {};
  std::vector<int64_t> profiler, optim;
  for (const SnapshotAnnotation& a : d.annotations) {
    if (a.time_us < 0 || (a.device >= 0 && a.device != device)) continue;
    if (a.name.rfind("ProfilerStep#", 0) == 0 && a.stage == "START") profiler.push_back(a.time_us);
    if (a.name.rfind("Optimizer.step#", 0) == 0 && a.stage == "END") optim.push_back(a.time_us);
  }
  std::vector<int64_t>* times = nullptr;
  if (!profiler.empty()) {
    times = &profiler;
    *source = "ProfilerStep annotations";
  } else if (!optim.empty()) {
    times = &optim;
    *source = "optimizer.step() annotations";
  } else {
    return {};
  }
  std::sort(times->begin(), times->end());
  std::vector<size_t> b;
  size_t j = 0;
  for (int64_t t : *times) {
    while (j < ev.size() && ev[j].time_us <= t) ++j;
    if (j > 0 && j < ev.size() && (b.empty() || b.back() != j)) b.push_back(j);
  }
  return b;
}

// Step boundaries from the period of the allocation-site sequence (no annotations).
std::vector<size_t> steps_from_period(const std::vector<TraceEvent>& ev, const std::vector<uint64_t>& alloc_before) {
  std::vector<size_t> idx;
  std::vector<uint64_t> sig;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].action != TraceAction::Alloc) continue;
    idx.push_back(i);
    sig.push_back(ev[i].size * 1000003ull ^ static_cast<uint64_t>(static_cast<uint32_t>(ev[i].stack)));
  }
  size_t n = sig.size();
  if (n < 8) return {};
  size_t pmax = std::min<size_t>(n / 2, 20000);
  size_t best_p = 0;
  double best = 0.0;
  // Judge each period on the last 60% only: the first step (model build, lazy optimizer state)
  // never repeats and would favour short in-step periods (one layer) over the step itself.
  const size_t start = n * 2 / 5;
  for (size_t p = 2; p <= pmax; ++p) {
    if (start + p >= n) break;
    size_t span = n - p - start;
    size_t stride = std::max<size_t>(1, span / 256);
    size_t hit = 0, tot = 0;
    for (size_t i = start; i + p < n; i += stride, ++tot) hit += sig[i] == sig[i + p];
    double score = tot ? static_cast<double>(hit) / static_cast<double>(tot) : 0.0;
    if (score > best + 0.02) {
      best = score;
      best_p = p;
    }
  }
  if (best_p == 0 || best < 0.6 || n / best_p < 2) return {};
  // Phase: the residue whose allocations start from the lowest level, judged on the regular tail.
  size_t tail = n / 2;
  size_t best_phase = 0;
  long double best_cost = -1;
  for (size_t ph = 0; ph < best_p; ++ph) {
    long double cost = 0;
    size_t cnt = 0;
    for (size_t j = ph; j < n; j += best_p) {
      if (j < tail) continue;
      cost += alloc_before[idx[j]];
      ++cnt;
    }
    if (!cnt) continue;
    cost /= cnt;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_phase = ph;
    }
  }
  std::vector<size_t> b;
  for (size_t j = best_phase; j < n; j += best_p)
    if (idx[j] > 0) b.push_back(idx[j]);
  return b;
}

void add_levers(SnapshotAnalysis& a) {
  const uint64_t flat = a.part_bytes[0], saw = a.part_bytes[1], stair = a.part_bytes[2];
  if (a.shape == "staircase") {
    a.levers.push_back({"staircase", "fix the leak",
                        format_bytes(a.leak_bytes_end) + " kept and never freed, ~" + format_bytes(a.leak_bytes_per_step) +
                            " more every step over " + std::to_string(a.leak_steps) + " steps, allocated at " + a.leak_site +
                            ". Usually a loss (or output) stored with its graph: keep loss.item() or loss.detach(), "
                            "drop retain_graph=True. No flag, batch size or bigger card fixes a leak.",
                        false});
  }
  struct Part {
    MemPart p;
    uint64_t bytes;
  };
  std::vector<Part> order = {{MemPart::Flat, flat}, {MemPart::Sawtooth, saw}};
  std::stable_sort(order.begin(), order.end(), [](const Part& x, const Part& y) { return x.bytes > y.bytes; });
  for (const Part& p : order) {
    if (p.bytes == 0) continue;
    if (p.p == MemPart::Flat) {
      std::string b = format_bytes(flat);
      a.levers.push_back({"flat", "dtype: bf16 weights / mixed precision",
                          b + " alive all run (weights, gradients kept between steps, optimizer state): fp32 -> bf16 halves weights; "
                              "check the policy's dtype default first",
                          false});
      a.levers.push_back({"flat", "freeze what you do not train (freeze_vision_encoder, train_expert_only)",
                          "frozen weights need no gradients and no optimizer state", true});
      a.levers.push_back({"flat", "LoRA adapters", "gradients and optimizer state only for the adapters", true});
      a.levers.push_back({"flat", "8-bit or sharded optimizer (adamw8bit, ZeRO/FSDP)",
                          "AdamW keeps two fp32 moments per trainable parameter", false});
    } else {
      std::string b = format_bytes(saw);
      a.levers.push_back({"sawtooth", "halve the batch, accumulate gradients to keep the effective batch",
                          b + " rises and falls within each step (activations, gradients, temporaries) and scales with the batch",
                          false});
      a.levers.push_back({"sawtooth", "gradient checkpointing",
                          "drops saved activations and recomputes them in backward (about 20-30% slower)", false});
      a.levers.push_back({"sawtooth", "shrink the inputs (cameras, image size, chunk length)",
                          "fewer tokens per sample, fewer activations; changes the task the model solves", true});
    }
  }
  if (stair > 0 && a.shape != "staircase") {
    a.levers.push_back({"staircase", "check the growing allocations",
                        format_bytes(stair) + " at the peak was added step after step and never freed", false});
  }
  uint64_t unalloc = a.reserved_at_peak > a.peak_allocated ? a.reserved_at_peak - a.peak_allocated : 0;
  if (a.oom) unalloc = a.oom->reserved_bytes > a.oom->allocated_bytes ? a.oom->reserved_bytes - a.oom->allocated_bytes : 0;
  uint64_t reserved = a.oom ? a.oom->reserved_bytes : a.reserved_at_peak;
  if (unalloc >= (256ull << 20) && unalloc * 4 >= reserved) {
    a.levers.push_back({"fragmentation",
                        a.expandable_segments ? "allocator: expandable segments are already on; garbage_collection_threshold"
                                              : "allocator: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                        format_bytes(unalloc) + " reserved but not allocated (" + pct(unalloc, reserved) +
                            " of reserved); the variable is PYTORCH_ALLOC_CONF from torch 2.10",
                        false});
  }
}

}  // namespace

const char* to_string(MemPart p) {
  switch (p) {
    case MemPart::Flat: return "flat";
    case MemPart::Sawtooth: return "sawtooth";
    case MemPart::Staircase: return "staircase";
  }
  return "?";
}

bool is_internal_frame(const SnapshotFrame& f) {
  const std::string& fn = f.filename;
  if (fn.empty() || fn == "??" || fn[0] == '<') return true;  // <frozen ...>, <string>
  if (contains(fn, "/torch/") || contains(fn, "\\torch\\")) return true;
  if (ends_with(fn, ".so") || ends_with(fn, ".cpp") || ends_with(fn, ".cc") || ends_with(fn, ".h") ||
      ends_with(fn, ".cu") || ends_with(fn, ".cuh") || ends_with(fn, ".c"))
    return true;  // C++ frames of stacks="all"
  // CPython's standard library (contextlib, functools, threading), not site-packages.
  if (contains(fn, "/lib/python3") && !contains(fn, "-packages/")) return true;
  return false;
}

Result<SnapshotAnalysis> analyze_snapshot(const SnapshotData& d, const SnapshotOptions& opts) {
  SnapshotAnalysis a;
  a.expandable_segments = d.expandable_segments;

  // --- device ---
  int dev = opts.device;
  if (dev >= 0) {
    bool seen = static_cast<size_t>(dev) < d.traces.size();
    for (const auto& s : d.segments) seen = seen || s.device == dev;
    if (!seen) return invalid_argument("device " + std::to_string(dev) + " has no trace and no segments in this snapshot");
  } else {
    dev = 0;
    size_t most = 0;
    for (size_t i = 0; i < d.traces.size(); ++i)
      if (d.traces[i].size() > most) {
        most = d.traces[i].size();
        dev = static_cast<int>(i);
      }
    if (most == 0) {
      std::map<int64_t, uint64_t> by_dev;
      for (const auto& s : d.segments) by_dev[s.device] += s.total_size;
      uint64_t best = 0;
      for (auto& [k, v] : by_dev)
        if (v > best) {
          best = v;
          dev = static_cast<int>(k);
        }
    }
  }
  a.device = dev;
  static const std::vector<TraceEvent> kEmpty;
  const std::vector<TraceEvent>& ev = static_cast<size_t>(dev) < d.traces.size() ? d.traces[dev] : kEmpty;
  const int64_t n = static_cast<int64_t>(ev.size());
  a.n_events = ev.size();
  a.has_trace = !ev.empty();

  // --- the dump state ---
  SiteTable sites;
  std::unordered_map<uint64_t, std::pair<uint64_t, int32_t>> live_end;  // addr -> size, stack
  for (const auto& s : d.segments) {
    if (s.device != dev) continue;
    ++a.n_segments;
    a.dump_reserved += s.total_size;
    for (const auto& b : s.blocks) {
      if (b.state == BlockState::ActiveAllocated || b.state == BlockState::ActivePendingFree) {
        a.dump_allocated += b.size;
        live_end[b.address] = {b.size, b.stack};
      }
    }
  }

  if (!a.has_trace) {
    // Segments only: what is alive at the dump, no history.
    a.notes.push_back(d.has_trace_key
                          ? "device_traces is empty: memory history was not recorded (call "
                            "torch.cuda.memory._record_memory_history(max_entries=100000) before the steps); "
                            "only the state at the dump is analysed, no peak over time and no shape"
                          : "no device_traces in this snapshot (torch 1.x/2.0 format or include_traces=False); "
                            "only the state at the dump is analysed");
    a.allocated_start = a.allocated_end = a.peak_allocated = a.dump_allocated;
    a.reserved_start = a.reserved_end = a.peak_reserved = a.reserved_at_peak = a.dump_reserved;
    std::map<uint32_t, SnapshotSite> agg;
    for (auto& [addr, sz] : live_end) {
      uint32_t id = sites.of_stack(d, sz.second, false);
      SnapshotSite& s = agg.try_emplace(id, sites.sites[id]).first->second;
      s.bytes += sz.first;
      s.count += 1;
      s.part_bytes[0] += sz.first;
    }
    for (auto& [id, s] : agg) a.top_sites.push_back(s);
    std::sort(a.top_sites.begin(), a.top_sites.end(),
              [](const SnapshotSite& x, const SnapshotSite& y) { return x.bytes != y.bytes ? x.bytes > y.bytes : x.site < y.site; });
    if (a.top_sites.size() > opts.top_sites) a.top_sites.resize(opts.top_sites);
    add_levers(a);
    return a;
  }

  a.first_time_us = ev.front().time_us;
  a.last_time_us = ev.back().time_us;

  // --- 1. backwards: what was alive before the first event ---
  std::unordered_map<uint64_t, std::pair<uint64_t, int32_t>> live = live_end;
  int64_t seg_delta = 0;  // reserved change over the trace
  for (int64_t i = n - 1; i >= 0; --i) {
    const TraceEvent& e = ev[i];
    switch (e.action) {
      case TraceAction::Alloc: live.erase(e.addr); break;
      case TraceAction::FreeCompleted: live[e.addr] = {block_size(e.size), -1}; break;
      case TraceAction::SegmentAlloc:
      case TraceAction::SegmentMap: seg_delta += static_cast<int64_t>(e.size); break;
      case TraceAction::SegmentFree:
      case TraceAction::SegmentUnmap: seg_delta -= static_cast<int64_t>(e.size); break;
      default: break;
    }
  }
  int64_t res0 = static_cast<int64_t>(a.dump_reserved) - seg_delta;
  if (res0 < 0) {
    a.notes.push_back("the trace allocates more segments than the dump holds; reserved before recording set to 0");
    res0 = 0;
  }
  a.reserved_start = static_cast<uint64_t>(res0);

  // --- 2. forwards: records and series ---
  std::vector<Rec> recs;
  std::unordered_map<uint64_t, size_t> open;
  for (auto& [addr, sz] : live) {
    Rec r;
    r.size = sz.first;
    r.alloc_ev = kBefore;
    r.free_ev = n;
    r.stack = sz.second;
    open[addr] = recs.size();
    recs.push_back(r);
    a.allocated_start += sz.first;
  }
  a.pre_recording_bytes = a.allocated_start;
  std::vector<uint64_t> alloc_series(ev.size()), res_series(ev.size()), alloc_before(ev.size());
  uint64_t allocated = a.allocated_start, reserved = a.reserved_start;
  a.peak_allocated = allocated;
  a.peak_event = -1;
  a.reserved_at_peak = reserved;
  a.peak_reserved = reserved;
  std::vector<size_t> ooms;
  for (int64_t i = 0; i < n; ++i) {
    const TraceEvent& e = ev[i];
    alloc_before[i] = allocated;
    switch (e.action) {
      case TraceAction::Alloc: {
        auto it = open.find(e.addr);
        if (it != open.end()) {  // alloc over a live block: close the old one here
          ++a.n_inconsistent;
          recs[it->second].free_ev = i;
          allocated -= std::min(allocated, recs[it->second].size);
        }
        Rec r;
        r.size = block_size(e.size);
        r.alloc_ev = i;
        r.free_ev = n;
        r.stack = e.stack;
        open[e.addr] = recs.size();
        recs.push_back(r);
        allocated += r.size;
        ++a.n_allocs;
        break;
      }
      case TraceAction::FreeCompleted: {
        auto it = open.find(e.addr);
        if (it == open.end()) {
          ++a.n_inconsistent;
          break;
        }
        recs[it->second].free_ev = i;
        allocated -= std::min(allocated, recs[it->second].size);
        open.erase(it);
        ++a.n_frees;
        break;
      }
      case TraceAction::SegmentAlloc:
      case TraceAction::SegmentMap: reserved += e.size; break;
      case TraceAction::SegmentFree:
      case TraceAction::SegmentUnmap: reserved -= std::min(reserved, e.size); break;
      case TraceAction::Oom: ooms.push_back(static_cast<size_t>(i)); break;
      default: break;
    }
    alloc_series[i] = allocated;
    res_series[i] = reserved;
    if (allocated > a.peak_allocated) {
      a.peak_allocated = allocated;
      a.peak_event = i;
      a.reserved_at_peak = reserved;
    }
    a.peak_reserved = std::max(a.peak_reserved, reserved);
  }
  a.allocated_end = allocated;
  a.reserved_end = reserved;
  if (a.n_inconsistent)
    a.notes.push_back(std::to_string(a.n_inconsistent) + " trace events did not match the block they name (ring buffer edge or a newer format)");
  if (a.allocated_end != a.dump_allocated)
    a.notes.push_back("replayed allocated bytes at the end (" + format_bytes(a.allocated_end) +
                      ") differ from the blocks alive at the dump (" + format_bytes(a.dump_allocated) + ")");
  if (a.pre_recording_bytes > 0)
    a.notes.push_back(format_bytes(a.pre_recording_bytes) +
                      " was already allocated when recording began (reconstructed from the segments; no stacks for it)");
  if (d.n_unknown_actions) a.notes.push_back(std::to_string(d.n_unknown_actions) + " trace entries of other kinds ignored");

  // --- 3. steps ---
  std::vector<size_t> bounds = steps_from_annotations(d, dev, ev, &a.step_source);
  if (bounds.empty()) {
    bounds = steps_from_period(ev, alloc_before);
    a.step_source = bounds.empty() ? "none" : "periodicity of allocation sites";
  }
  const int64_t n_steps = static_cast<int64_t>(bounds.size()) + 1;
  auto step_of = [&](int64_t i) -> int64_t {
    if (i < 0) return -1;
    return static_cast<int64_t>(std::upper_bound(bounds.begin(), bounds.end(), static_cast<size_t>(i)) - bounds.begin());
  };
  for (int64_t s = 0; s < n_steps; ++s) {
    SnapshotStep st;
    st.begin_event = s == 0 ? 0 : bounds[s - 1];
    st.end_event = s + 1 < n_steps ? bounds[s] : ev.size();
    st.start_bytes = alloc_before[st.begin_event];
    st.end_bytes = st.end_event > 0 ? alloc_series[st.end_event - 1] : a.allocated_start;
    st.peak_bytes = st.start_bytes;
    for (size_t i = st.begin_event; i < st.end_event; ++i) st.peak_bytes = std::max(st.peak_bytes, alloc_series[i]);
    a.steps.push_back(st);
  }
  a.peak_step = static_cast<size_t>(std::max<int64_t>(0, step_of(a.peak_event)));

  // --- 4. classify every record ---
  for (Rec& r : recs) r.site = sites.of_stack(d, r.stack, r.alloc_ev == kBefore);
  // Leak evidence: survivors (never freed) from the same site in several complete steps.
  const int64_t last_step = n_steps - 1;
  std::map<std::pair<uint32_t, uint64_t>, std::set<int64_t>> survivor_steps;
  auto leak_key = [&](const Rec& r) { return std::make_pair(r.site, r.stack < 0 ? r.size : 0); };
  for (const Rec& r : recs) {
    if (r.free_ev != n || r.alloc_ev == kBefore) continue;
    int64_t s = step_of(r.alloc_ev);
    if (s < last_step || n_steps == 1) survivor_steps[leak_key(r)].insert(s);
  }
  auto is_leak = [&](const Rec& r) {
    if (r.free_ev != n || r.alloc_ev == kBefore) return false;
    auto it = survivor_steps.find(leak_key(r));
    if (it == survivor_steps.end()) return false;
    size_t k = it->second.size();
    return k >= 3 || (k >= 2 && n_steps <= 3);
  };
  std::map<uint32_t, uint64_t> leak_by_site;
  for (Rec& r : recs) {
    if (is_leak(r)) {
      r.part = MemPart::Staircase;
      a.leak_bytes_end += r.size;
      leak_by_site[r.site] += r.size;
      a.leak_steps = std::max(a.leak_steps, survivor_steps[leak_key(r)].size());
    } else if (r.free_ev == n) {
      bool current_step = n_steps > 1 && r.alloc_ev != kBefore && step_of(r.alloc_ev) == last_step;
      r.part = current_step ? MemPart::Sawtooth : MemPart::Flat;
    } else {
      int64_t crossed = step_of(r.free_ev) - step_of(r.alloc_ev);
      r.part = crossed <= 1 ? MemPart::Sawtooth : MemPart::Flat;
    }
  }
  if (a.leak_steps) a.leak_bytes_per_step = a.leak_bytes_end / a.leak_steps;
  uint64_t best_leak = 0;
  for (auto& [site, bytes] : leak_by_site)
    if (bytes > best_leak) {
      best_leak = bytes;
      a.leak_site = sites.sites[site].site;
    }

  // --- 5. the peak: parts and sites ---
  const int64_t P = a.peak_event;
  std::map<uint32_t, SnapshotSite> agg;
  for (const Rec& r : recs) {
    if (!(r.alloc_ev <= P && P < r.free_ev)) continue;
    a.part_bytes[static_cast<int>(r.part)] += r.size;
    SnapshotSite& s = agg.try_emplace(r.site, sites.sites[r.site]).first->second;
    s.bytes += r.size;
    s.count += 1;
    s.part_bytes[static_cast<int>(r.part)] += r.size;
  }
  std::vector<SnapshotSite> all_sites;
  for (auto& [id, s] : agg) {
    int best = 0;
    for (int k = 1; k < 3; ++k)
      if (s.part_bytes[k] > s.part_bytes[best]) best = k;
    s.dominant = static_cast<MemPart>(best);
    all_sites.push_back(s);
  }
  std::sort(all_sites.begin(), all_sites.end(),
            [](const SnapshotSite& x, const SnapshotSite& y) { return x.bytes != y.bytes ? x.bytes > y.bytes : x.site < y.site; });
  a.top_sites.assign(all_sites.begin(), all_sites.begin() + static_cast<ptrdiff_t>(std::min(all_sites.size(), opts.top_sites)));

  // --- 6. shape ---
  uint64_t leak_floor = std::max<uint64_t>(1ull << 20, a.peak_allocated / 20);
  if (a.leak_bytes_end >= leak_floor && a.leak_steps >= 2) a.shape = "staircase";
  else if (a.part_bytes[0] >= a.part_bytes[1]) a.shape = "flat";
  else a.shape = "sawtooth";
  if (a.step_source == "none")
    a.notes.push_back("no step boundaries found (no annotations, no repeating allocation pattern): the whole trace is one step");

  // --- 7. OOM ---
  if (!ooms.empty()) {
    size_t i = ooms.back();
    SnapshotOom o;
    o.n_ooms = ooms.size();
    o.event = i;
    o.step = static_cast<size_t>(std::max<int64_t>(0, step_of(static_cast<int64_t>(i))));
    o.requested_bytes = ev[i].size;
    o.device_free_bytes = ev[i].device_free;
    o.allocated_bytes = alloc_series[i];
    o.reserved_bytes = res_series[i];
    o.site = sites.sites[sites.of_stack(d, ev[i].stack, false)].site;
    if (o.device_free_bytes > o.requested_bytes)
      a.notes.push_back("at the OOM CUDA still reported " + format_bytes(o.device_free_bytes) + " free for a request of " +
                        format_bytes(o.requested_bytes) +
                        ": a per-process memory fraction (torch.cuda.set_per_process_memory_fraction) or a pool limit "
                        "refused it, not the card");
    a.oom = o;
  }

  add_levers(a);

  // --- 8. timeline samples (max-preserving) and per-site stacks ---
  size_t k = std::max<size_t>(2, opts.timeline_points);
  std::vector<int64_t> samples = {-1};
  size_t per = (ev.size() + k - 1) / k;
  for (size_t b0 = 0; b0 < ev.size(); b0 += per) {
    size_t b1 = std::min(ev.size(), b0 + per);
    size_t best = b0;
    for (size_t i = b0; i < b1; ++i)
      if (alloc_series[i] > alloc_series[best]) best = i;
    samples.push_back(static_cast<int64_t>(best));
    if (b1 == ev.size() && best != b1 - 1) samples.push_back(static_cast<int64_t>(b1 - 1));
  }
  if (P >= 0 && !std::binary_search(samples.begin(), samples.end(), P)) {
    samples.push_back(P);
    std::sort(samples.begin(), samples.end());
  }
  size_t n_plot = std::min(opts.plot_sites, all_sites.size());
  std::unordered_map<std::string, size_t> plot_index;
  for (size_t s = 0; s < n_plot; ++s) {
    a.timeline_sites.push_back(all_sites[s].site);
    plot_index[all_sites[s].site] = s;
  }
  std::vector<std::vector<int64_t>> diff(n_plot, std::vector<int64_t>(samples.size() + 1, 0));
  for (const Rec& r : recs) {
    auto it = plot_index.find(sites.sites[r.site].site);
    if (it == plot_index.end()) continue;
    size_t lo = std::lower_bound(samples.begin(), samples.end(), r.alloc_ev) - samples.begin();
    size_t hi = std::lower_bound(samples.begin(), samples.end(), r.free_ev) - samples.begin();
    if (lo >= hi) continue;
    diff[it->second][lo] += static_cast<int64_t>(r.size);
    diff[it->second][hi] -= static_cast<int64_t>(r.size);
  }
  std::vector<int64_t> acc(n_plot, 0);
  for (size_t j = 0; j < samples.size(); ++j) {
    SnapshotTimelinePoint pt;
    pt.event = samples[j];
    pt.allocated = samples[j] < 0 ? a.allocated_start : alloc_series[samples[j]];
    pt.reserved = samples[j] < 0 ? a.reserved_start : res_series[samples[j]];
    for (size_t s = 0; s < n_plot; ++s) {
      acc[s] += diff[s][j];
      pt.by_site.push_back(static_cast<uint64_t>(std::max<int64_t>(0, acc[s])));
    }
    a.timeline.push_back(std::move(pt));
  }
  return a;
}

}  // namespace vlac
