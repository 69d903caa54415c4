// Snapshot decoding: PickleDoc -> SnapshotData. Walks a fixed schema (root -> segments ->
// blocks -> frames), never the pickle's own nesting, so hostile nesting cannot recurse here.
#include "diag/snapshot_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#ifdef VLAC_HAVE_LZMA
#include <lzma.h>
#endif

#include "core/mapped_file.h"

namespace vlac {

namespace {

constexpr size_t kMaxFramesPerStack = 512;

class Decoder {
 public:
  explicit Decoder(const PickleDoc& doc) : d_(doc) {}

  Result<SnapshotData> run() {
    SnapshotData out;
    out.n_opaque_values = d_.n_opaque();
    PickleId root = d_.root();
    PickleId segs = 0;
    if (d_.is(root, PickleKind::List)) {
      out.legacy_segment_list = true;
      segs = root;
    } else if (d_.is(root, PickleKind::Dict)) {
      auto s = d_.get(root, "segments");
      if (!s) return invalid_format("not a PyTorch memory snapshot: the top-level dict has no 'segments' key");
      segs = *s;
      if (!d_.is(segs, PickleKind::List)) return invalid_format(std::string("'segments' is a ") + to_string(d_.kind(segs)) + ", not a list");
    } else {
      return invalid_format(std::string("not a PyTorch memory snapshot: the pickle holds a ") + to_string(d_.kind(root)) +
                            " (expected a dict with 'segments' and 'device_traces')");
    }
    auto seg_items = d_.items(segs);
    out.segments.reserve(seg_items.size());
    for (size_t i = 0; i < seg_items.size(); ++i) {
      if (!d_.is(seg_items[i], PickleKind::Dict))
        return invalid_format("segments[" + std::to_string(i) + "] is a " + to_string(d_.kind(seg_items[i])) + ", not a dict");
      out.segments.push_back(segment(seg_items[i], out));
    }
    if (!out.legacy_segment_list) {
      if (auto t = d_.get(root, "device_traces")) {
        if (!d_.is(*t, PickleKind::List) && !d_.is(*t, PickleKind::None))
          return invalid_format(std::string("'device_traces' is a ") + to_string(d_.kind(*t)) + ", not a list");
        out.has_trace_key = d_.is(*t, PickleKind::List);
        for (PickleId dev : d_.items(*t)) {
          out.traces.emplace_back();
          if (!d_.is(dev, PickleKind::List)) continue;
          for (PickleId e : d_.items(dev)) {
            if (!d_.is(e, PickleKind::Dict)) {
              ++out.n_unknown_actions;
              continue;
            }
            out.traces.back().push_back(event(e, out));
          }
        }
      }
      if (auto a = d_.get(root, "external_annotations")) {
        for (PickleId e : d_.items(*a)) {
          if (!d_.is(e, PickleKind::Dict)) continue;
          SnapshotAnnotation ann;
          ann.name = str(e, "name");
          ann.stage = str(e, "stage");
          ann.device = num(e, "device", -1);
          ann.time_us = num(e, "time_us", -1);
          out.annotations.push_back(std::move(ann));
        }
      }
      if (auto s = d_.get(root, "allocator_settings"); s && d_.is(*s, PickleKind::Dict)) {
        if (auto e = d_.get(*s, "expandable_segments")) out.expandable_segments = d_.as_bool(*e).value_or(false);
        out.alloc_conf = str(*s, "PYTORCH_CUDA_ALLOC_CONF");
        if (out.alloc_conf.empty()) out.alloc_conf = str(*s, "PYTORCH_ALLOC_CONF");
      }
    }
    out.stacks = std::move(stacks_);
    return out;
  }

 private:
  int64_t num(PickleId dict, std::string_view key, int64_t dflt) const {
    auto v = d_.get(dict, key);
    if (!v) return dflt;
    if (auto i = d_.as_int(*v)) return *i;
    // A float from the file may be NaN or beyond int64: converting those is undefined behaviour.
    if (auto f = d_.as_number(*v)) {
      if (std::isfinite(*f) && *f > -9.2e18 && *f < 9.2e18) return static_cast<int64_t>(*f);
      return dflt;
    }
    return dflt;
  }
  uint64_t unum(PickleId dict, std::string_view key) const {
    int64_t v = num(dict, key, 0);
    return v < 0 ? 0 : static_cast<uint64_t>(v);
  }
  uint64_t addr(PickleId dict, std::string_view key) const {
    return static_cast<uint64_t>(num(dict, key, 0));  // addresses keep their bits
  }
  std::string str(PickleId dict, std::string_view key) const {
    auto v = d_.get(dict, key);
    if (!v) return {};
    const std::string* s = d_.as_str(*v);
    return s ? *s : std::string();
  }

  int32_t stack_of(PickleId dict, std::string_view key) {
    auto v = d_.get(dict, key);
    if (!v || !d_.is(*v, PickleKind::List) || d_.items(*v).empty()) return -1;
    auto it = interned_.find(*v);
    if (it != interned_.end()) return it->second;
    std::vector<SnapshotFrame> frames;
    for (PickleId f : d_.items(*v)) {
      if (frames.size() == kMaxFramesPerStack) break;
      if (!d_.is(f, PickleKind::Dict)) continue;
      SnapshotFrame fr;
      fr.filename = str(f, "filename");
      fr.line = num(f, "line", 0);
      fr.name = str(f, "name");
      frames.push_back(std::move(fr));
    }
    // Torch may emit equal tracebacks as separate lists: intern by content too, so one call
    // site is one stack (the step detector compares stacks).
    std::string content;
    for (const SnapshotFrame& fr : frames)
      content += fr.filename + '\0' + std::to_string(fr.line) + '\0' + fr.name + '\0';
    auto same = by_content_.find(content);
    int32_t id;
    if (same != by_content_.end()) {
      id = same->second;
    } else {
      id = static_cast<int32_t>(stacks_.size());
      stacks_.push_back(std::move(frames));
      by_content_.emplace(std::move(content), id);
    }
    interned_.emplace(*v, id);
    return id;
  }

  SnapshotSegment segment(PickleId s, SnapshotData& /*out*/) {
    SnapshotSegment seg;
    seg.device = num(s, "device", 0);
    seg.address = addr(s, "address");
    seg.total_size = unum(s, "total_size");
    seg.is_expandable = num(s, "is_expandable", 0) != 0;
    seg.segment_type = str(s, "segment_type");
    if (auto p = d_.get(s, "segment_pool_id")) {
      for (PickleId x : d_.items(*p))
        if (d_.as_int(x).value_or(0) != 0) seg.private_pool = true;
    }
    uint64_t running = seg.address;
    if (auto bl = d_.get(s, "blocks")) {
      for (PickleId b : d_.items(*bl)) {
        if (!d_.is(b, PickleKind::Dict)) continue;
        SnapshotBlock blk;
        blk.size = unum(b, "size");
        blk.requested_size = unum(b, "requested_size");
        blk.address = d_.get(b, "address") ? addr(b, "address") : running;  // 1.x: running sum
        running = blk.address + blk.size;
        std::string st = str(b, "state");
        if (st == "active_allocated") blk.state = BlockState::ActiveAllocated;
        else if (st == "active_pending_free" || st == "active_awaiting_free") blk.state = BlockState::ActivePendingFree;
        else if (st == "inactive") blk.state = BlockState::Inactive;
        blk.stack = stack_of(b, "frames");
        if (auto h = d_.get(b, "history"); h && d_.is(*h, PickleKind::List) && !d_.items(*h).empty()) {
          PickleId last = d_.items(*h).back();  // torch 2.0: [{addr, real_size, frames}, ...]
          if (d_.is(last, PickleKind::Dict)) {
            if (blk.stack < 0) blk.stack = stack_of(last, "frames");
            if (blk.requested_size == 0) blk.requested_size = unum(last, "real_size");
          }
        }
        if (blk.requested_size == 0) blk.requested_size = blk.size;
        seg.blocks.push_back(blk);
      }
    }
    return seg;
  }

  TraceEvent event(PickleId e, SnapshotData& out) {
    TraceEvent ev;
    std::string a = str(e, "action");
    if (a == "alloc") ev.action = TraceAction::Alloc;
    else if (a == "free_requested") ev.action = TraceAction::FreeRequested;
    else if (a == "free_completed") ev.action = TraceAction::FreeCompleted;
    else if (a == "segment_alloc") ev.action = TraceAction::SegmentAlloc;
    else if (a == "segment_free") ev.action = TraceAction::SegmentFree;
    else if (a == "segment_map") ev.action = TraceAction::SegmentMap;
    else if (a == "segment_unmap") ev.action = TraceAction::SegmentUnmap;
    else if (a == "snapshot") ev.action = TraceAction::Snapshot;
    else if (a == "oom") ev.action = TraceAction::Oom;
    else {
      ev.action = TraceAction::Other;
      ++out.n_unknown_actions;
    }
    ev.addr = addr(e, "addr");
    ev.size = unum(e, "size");
    ev.device_free = unum(e, "device_free");
    ev.time_us = num(e, "time_us", -1);
    ev.stack = stack_of(e, "frames");
    return ev;
  }

  const PickleDoc& d_;
  std::vector<std::vector<SnapshotFrame>> stacks_;
  std::unordered_map<PickleId, int32_t> interned_;
  std::unordered_map<std::string, int32_t> by_content_;
};

}  // namespace

const char* to_string(TraceAction a) {
  switch (a) {
    case TraceAction::Alloc: return "alloc";
    case TraceAction::FreeRequested: return "free_requested";
    case TraceAction::FreeCompleted: return "free_completed";
    case TraceAction::SegmentAlloc: return "segment_alloc";
    case TraceAction::SegmentFree: return "segment_free";
    case TraceAction::SegmentMap: return "segment_map";
    case TraceAction::SegmentUnmap: return "segment_unmap";
    case TraceAction::Snapshot: return "snapshot";
    case TraceAction::Oom: return "oom";
    case TraceAction::Other: return "other";
  }
  return "?";
}

Result<SnapshotData> decode_snapshot(const PickleDoc& doc) { return Decoder(doc).run(); }

namespace {

bool is_xz(std::span<const uint8_t> b) {
  static const uint8_t kMagic[6] = {0xFD, '7', 'z', 'X', 'Z', 0x00};
  return b.size() >= 6 && std::memcmp(b.data(), kMagic, 6) == 0;
}

// The whole xz stream into memory, refusing more than `cap` bytes out (a pickle bigger than the
// reader's input limit would be refused anyway) and any stream error, naming the file.
Result<std::vector<uint8_t>> unxz(std::span<const uint8_t> in, uint64_t cap, const std::string& path) {
#ifdef VLAC_HAVE_LZMA
  lzma_stream s = LZMA_STREAM_INIT;
  if (lzma_stream_decoder(&s, 1ull << 30, 0) != LZMA_OK) return invalid_format(path + ": cannot start the xz decoder");
  std::vector<uint8_t> out(std::min<uint64_t>(cap, std::max<uint64_t>(in.size() * 8, 1 << 20)));
  s.next_in = in.data();
  s.avail_in = in.size();
  s.next_out = out.data();
  s.avail_out = out.size();
  lzma_ret r = LZMA_OK;
  while (true) {
    r = lzma_code(&s, LZMA_FINISH);
    if (r == LZMA_STREAM_END) break;
    if (r != LZMA_OK && r != LZMA_BUF_ERROR) break;
    if (s.avail_out == 0) {
      const size_t used = out.size();
      if (used >= cap) {
        lzma_end(&s);
        return invalid_format(path + ": xz stream decompresses to more than " + std::to_string(cap) + " bytes");
      }
      out.resize(std::min<uint64_t>(cap, used * 2));
      s.next_out = out.data() + used;
      s.avail_out = out.size() - used;
    } else if (r == LZMA_BUF_ERROR) {
      break;  // input ended before the stream did
    }
  }
  const size_t produced = out.size() - s.avail_out;
  lzma_end(&s);
  if (r != LZMA_STREAM_END)
    return invalid_format(path + ": not a complete xz stream (liblzma error " + std::to_string(static_cast<int>(r)) + ")");
  out.resize(produced);
  return out;
#else
  (void)in;
  (void)cap;
  return invalid_format(path + ": xz-compressed snapshot, but this vlac was built without liblzma (install liblzma-dev and rebuild, or run xz -d first)");
#endif
}

}  // namespace

Result<SnapshotData> load_snapshot_file(const std::string& path, const PickleLimits& limits) {
  auto map = MappedFile::open(path);
  if (!map.is_ok()) return map.status();
  std::span<const uint8_t> bytes(map->data(), static_cast<size_t>(map->size()));
  std::vector<uint8_t> plain;
  if (is_xz(bytes)) {
    VLAC_ASSIGN_OR_RETURN(plain, unxz(bytes, limits.max_input_bytes, path));
    bytes = std::span<const uint8_t>(plain.data(), plain.size());
  }
  auto doc = read_pickle(bytes, limits);
  if (!doc.is_ok()) return doc.status().with_context(path);
  auto data = decode_snapshot(doc.value());
  if (!data.is_ok()) return data.status().with_context(path);
  return data;
}

}  // namespace vlac
