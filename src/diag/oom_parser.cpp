// PyTorch OOM message reader: a hand-written scanner over a whitespace-free copy of the log
// (so wrapped lines and double spaces match like the original). No regex, no recursion,
// every read bounds-checked; linear in the input.
#include "diag/oom_parser.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace vlac::diag {
namespace {

constexpr size_t kWindowChars = 8192;   // one message is < 1 KiB squeezed; logs can be MBs
constexpr size_t kHintChars = 700;      // hints follow the numbers within this many chars
constexpr size_t kMaxAnchors = 100000;  // counting stops here

__extension__ typedef unsigned __int128 U128;  // exact value*unit/10^d without overflow

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c < 0x20 || c == 0x7f; }

bool starts_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// ---- log-prefix stripping (only matters on continuation lines of a wrapped message) ----

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size() && is_space(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// Length of "d{n}" at i, or 0.
size_t digits_at(std::string_view s, size_t i, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (i + k >= s.size() || !is_digit(s[i + k])) return 0;
  return n;
}

// "HH:MM:SS" with optional ".frac" / ",frac"; returns length or 0.
size_t time_at(std::string_view s, size_t i) {
  if (!digits_at(s, i, 2) || i + 8 > s.size() || s[i + 2] != ':' || !digits_at(s, i + 3, 2) || s[i + 5] != ':' ||
      !digits_at(s, i + 6, 2))
    return 0;
  size_t j = i + 8;
  if (j < s.size() && (s[j] == '.' || s[j] == ',')) {
    size_t k = j + 1;
    while (k < s.size() && is_digit(s[k]) && k - j < 12) ++k;
    if (k > j + 1) j = k;
  }
  return j - i;
}

// One known prefix at the start of `s`; returns its length (incl. trailing spaces) or 0.
size_t prefix_len(std::string_view s) {
  if (s.empty()) return 0;
  // [rank0]:  [rank 3]:
  if (starts_with(s, "[rank")) {
    size_t e = s.find("]:");
    if (e != std::string_view::npos && e < 16) return skip_spaces(s, e + 2);
  }
  // 2025-11-12T11:25:13.4971964Z  /  2025-07-18 11:07:06.132422:
  if (digits_at(s, 0, 4) && s.size() > 10 && s[4] == '-' && digits_at(s, 5, 2) && s[7] == '-' && digits_at(s, 8, 2) &&
      (s[10] == 'T' || s[10] == ' ')) {
    size_t t = time_at(s, 11);
    if (t) {
      size_t j = 11 + t;
      if (j < s.size() && s[j] == 'Z') ++j;
      if (j < s.size() && s[j] == ':') ++j;
      return skip_spaces(s, j);
    }
  }
  // 07-29 21:48:54 (vLLM), 11:07:06.132657 (glog)
  if (digits_at(s, 0, 2) && s.size() > 5 && s[2] == '-' && digits_at(s, 3, 2) && s[5] == ' ') {
    size_t t = time_at(s, 6);
    if (t) return skip_spaces(s, 6 + t);
  }
  if (size_t t = time_at(s, 0)) return skip_spaces(s, t);
  // (Worker_TP0 pid=548)
  if (s[0] == '(') {
    size_t e = s.find(')');
    if (e != std::string_view::npos && e < 64) {
      size_t pid = s.substr(0, e).find("pid=");
      if (pid != std::string_view::npos) return skip_spaces(s, e + 1);
    }
  }
  // [multiproc_executor.py:962]
  if (s[0] == '[') {
    size_t e = s.find(']');
    if (e != std::string_view::npos && e < 80 && s.substr(0, e).find(".py:") != std::string_view::npos)
      return skip_spaces(s, e + 1);
  }
  // Log levels: "ERROR ", "WARNING ", "INFO " followed by more prefix; glog "E0718 ".
  for (std::string_view lvl : {"ERROR ", "WARNING ", "INFO ", "DEBUG ", "CRITICAL "}) {
    if (starts_with(s, lvl)) {
      size_t j = skip_spaces(s, lvl.size());
      if (j < s.size() && (is_digit(s[j]) || s[j] == '[')) return j;
    }
  }
  // pytest "E       text"
  if (s.size() > 3 && s[0] == 'E' && s[1] == ' ' && s[2] == ' ') return skip_spaces(s, 1);
  // markdown quote
  if (s[0] == '>') return skip_spaces(s, 1);
  return 0;
}

std::string_view strip_prefixes(std::string_view line) {
  size_t i = skip_spaces(line, 0);
  for (int round = 0; round < 6 && i < line.size(); ++round) {
    size_t n = prefix_len(line.substr(i));
    if (n == 0) break;
    i += n;
  }
  return line.substr(i);
}

// Appends `line` to `out` with whitespace collapsed, markdown emphasis/code marks dropped and the
// few HTML entities issue trackers produce decoded.
void append_clean(std::string& out, std::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == '*' || c == '`') continue;
    if (c == '&') {
      static constexpr std::array<std::pair<std::string_view, char>, 6> kEnt = {{
          {"&gt;", '>'}, {"&lt;", '<'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&#39;", '\''}, {"&nbsp;", ' '}}};
      bool done = false;
      for (const auto& [ent, ch] : kEnt) {
        if (starts_with(line.substr(i), ent)) {
          out.push_back(ch);
          i += ent.size() - 1;
          done = true;
          break;
        }
      }
      if (done) continue;
    }
    if (c == '\\' && i + 1 < line.size()) {
      if (line[i + 1] == 'n' || line[i + 1] == 't') {  // escaped newline inside a Python repr
        c = ' ';
        ++i;
      } else if (line[i + 1] == '_') {  // markdown-escaped underscore
        continue;
      }
    }
    if (is_space(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
      continue;
    }
    out.push_back(c);
  }
}

std::string squeeze(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s)
    if (c != ' ') out.push_back(c);
  return out;
}

// ---- sizes ----

struct SizeRead {
  PrintedSize size;
  bool overflow = false;
  size_t len = 0;
};

std::optional<SizeRead> read_size(std::string_view s, size_t p) {
  size_t i = p;
  size_t int_digits = 0;
  U128 num = 0;
  while (i < s.size() && is_digit(s[i])) {
    if (int_digits < 21) num = num * 10 + static_cast<unsigned>(s[i] - '0');
    ++int_digits;
    ++i;
  }
  if (int_digits == 0 || int_digits > 20) return std::nullopt;
  size_t frac_digits = 0;
  size_t frac_start = i;
  if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
    ++i;
    frac_start = i;
    while (i < s.size() && is_digit(s[i])) {
      if (frac_digits < 6) {
        num = num * 10 + static_cast<unsigned>(s[i] - '0');
        ++frac_digits;
      }
      ++i;
    }
  }
  size_t num_end = i;
  // Unit; the squeezed text has no space between number and unit.
  static constexpr std::array<std::pair<std::string_view, uint64_t>, 10> kUnits = {{
      {"bytes", 1},
      {"KiB", 1ull << 10},
      {"MiB", 1ull << 20},
      {"GiB", 1ull << 30},
      {"TiB", 1ull << 40},
      {"KB", 1ull << 10},  // the old MPS allocator: 1024-based despite the name
      {"MB", 1ull << 20},
      {"GB", 1ull << 30},
      {"TB", 1ull << 40},
      {"B", 1},
  }};
  std::string_view rest = s.substr(i);
  for (const auto& [name, mult] : kUnits) {
    if (!starts_with(rest, name)) continue;
    U128 scale = 1;
    for (size_t k = 0; k < frac_digits; ++k) scale *= 10;
    U128 v = (num * mult + scale / 2) / scale;
    SizeRead r;
    r.overflow = v > static_cast<U128>(UINT64_MAX);
    r.size.bytes = r.overflow ? UINT64_MAX : static_cast<uint64_t>(v);
    if (mult > 1) {
      U128 half = static_cast<U128>(mult) / (2 * scale);
      r.size.uncertainty = static_cast<uint64_t>(half);
    }
    r.size.text.assign(s.substr(p, num_end - p));
    r.size.text.push_back(' ');
    r.size.text.append(name);
    (void)frac_start;
    r.len = i + name.size() - p;
    return r;
  }
  return std::nullopt;
}

// ---- the scanner over one message window ----

struct Scan {
  std::string_view s;  // squeezed window
  size_t p = 0;
  bool stopped = false;      // the expected text did not follow
  bool hit_end = false;      // ... because the window ended (a cut paste)
  std::string stop_after;    // what was read last

  std::string_view rest() const { return p < s.size() ? s.substr(p) : std::string_view(); }
  bool at_end() const { return p >= s.size(); }
  bool peek(std::string_view lit) const { return starts_with(rest(), lit); }
  bool eat(std::string_view lit) {
    if (!peek(lit)) return false;
    p += lit.size();
    return true;
  }
  // Like eat, but records where the message stopped when the text is not there.
  bool expect(std::string_view lit, std::string_view after) {
    if (eat(lit)) return true;
    fail(lit, after);
    return false;
  }
  void fail(std::string_view lit, std::string_view after) {
    if (stopped) return;
    stopped = true;
    std::string_view r = rest();
    hit_end = r.size() < lit.size() && starts_with(lit, r);
    if (r.empty()) hit_end = true;
    stop_after.assign(after);
  }
  std::optional<SizeRead> size(std::string_view after) {
    auto r = read_size(s, p);
    if (!r) {
      if (!stopped) {
        stopped = true;
        // A cut inside a number ("9.2") or right before it counts as the end.
        size_t k = p;
        while (k < s.size() && (is_digit(s[k]) || s[k] == '.')) ++k;
        hit_end = (k >= s.size());
        stop_after.assign(after);
      }
      return std::nullopt;
    }
    p += r->len;
    return r;
  }
  std::optional<uint64_t> integer() {
    size_t i = p;
    uint64_t v = 0;
    while (i < s.size() && is_digit(s[i]) && i - p < 19) v = v * 10 + static_cast<uint64_t>(s[i++] - '0');
    if (i == p) return std::nullopt;
    while (i < s.size() && is_digit(s[i])) ++i;  // absurdly long: keep the first 19 digits
    p = i;
    return v;
  }
};

struct Anchor {
  size_t start = 0;       // where the header starts ("CUDAoutofmemory." or "Triedtoallocate")
  size_t tried = 0;       // position of "Triedtoallocate" (or of the MPS header)
  OomKind kind = OomKind::Cuda;
  bool assumed = false;
  bool mps = false;
};

// Next OOM message at or after `from` in the squeezed text. `mps_cache` remembers the next MPS
// header so that a log with many messages is scanned once (callers pass increasing `from`).
std::optional<Anchor> next_anchor(std::string_view sq, size_t from, size_t& mps_cache) {
  constexpr std::string_view kTried = "Triedtoallocate";
  constexpr std::string_view kMps = "MPSbackendoutofmemory(";
  if (mps_cache != std::string_view::npos && mps_cache < from) mps_cache = sq.find(kMps, from);
  size_t mps = mps_cache;
  size_t q = from;
  while (true) {
    q = sq.find(kTried, q);
    if (q == std::string_view::npos || (mps != std::string_view::npos && q > mps)) break;
    std::string_view before = sq.substr(0, q);
    Anchor a;
    a.tried = q;
    struct H { std::string_view text; OomKind kind; bool assumed; };
    static constexpr std::array<H, 4> kHeads = {{{"CUDAoutofmemory.", OomKind::Cuda, false},
                                                 {"HIPoutofmemory.", OomKind::Hip, false},
                                                 {"XPUoutofmemory.", OomKind::Xpu, false},
                                                 {"Outofmemory.", OomKind::Cuda, true}}};
    bool found = false;
    // A message needs its size: "Tried to allocate" followed by prose is not one.
    if (!read_size(sq, q + kTried.size())) {
      q += kTried.size();
      continue;
    }
    for (const auto& h : kHeads) {
      if (ends_with(before, h.text)) {
        a.start = q - h.text.size();
        a.kind = h.kind;
        a.assumed = h.assumed;
        found = true;
        break;
      }
    }
    if (!found) {
      // Head cut off: accept only the unmistakable "(GPU n;" shape after the size.
      auto sz = read_size(sq, q + kTried.size());
      if (sz && starts_with(sq.substr(q + kTried.size() + sz->len), "(GPU")) {
        a.start = q;
        a.kind = OomKind::Cuda;
        a.assumed = true;
        found = true;
      }
    }
    if (found) return a;
    q += kTried.size();
  }
  if (mps != std::string_view::npos) {
    Anchor a;
    a.start = a.tried = mps;
    a.kind = OomKind::Mps;
    a.mps = true;
    return a;
  }
  return std::nullopt;
}

std::string exception_before(std::string_view sq, size_t start) {
  std::string_view before = sq.substr(0, start);
  while (!before.empty() && (before.back() == '\'' || before.back() == '"' || before.back() == '(' ||
                             before.back() == '.' || before.back() == '-'))
    before.remove_suffix(1);
  static constexpr std::array<std::string_view, 6> kTypes = {
      "torch.cuda.OutOfMemoryError", "torch.OutOfMemoryError", "OutOfMemoryError", "RuntimeError",
      "torch.AcceleratorError", "AcceleratorError"};
  if (!before.empty() && before.back() == ':') before.remove_suffix(1);
  for (std::string_view t : kTypes)
    if (ends_with(before, t)) return std::string(t);
  return "";
}

void set_size(std::optional<PrintedSize>& field, const std::optional<SizeRead>& r, OomMessage& m,
              std::string_view what) {
  if (!r) return;
  if (r->overflow) {
    m.warnings.push_back(std::string(what) + " is printed as " + r->size.text +
                         ", more than 2^64 bytes: not a real value, ignored");
    return;
  }
  field = r->size;
}

void parse_old_form(Scan& sc, OomMessage& m) {
  // "(GPU n; T total capacity; A already allocated; F free; [L allowed; ]C cached)" or
  // "...; R reserved in total by PyTorch)". IPEX's XPU printed the same shape.
  m.wording = OomWording::ReservedTotal;  // until a "cached" field says otherwise
  if (auto d = sc.integer()) m.device = static_cast<int>(std::min<uint64_t>(*d, 1u << 20));
  if (!sc.expect(";", "the device number")) return;
  while (!sc.stopped) {
    if (sc.eat(")")) return;
    auto r = sc.size("a field of the (GPU ...) list");
    if (!r) return;
    size_t e = sc.p;
    while (e < sc.s.size() && sc.s[e] != ';' && sc.s[e] != ')' && e - sc.p < 64) ++e;
    std::string_view label = sc.s.substr(sc.p, e - sc.p);
    bool closed_label = e < sc.s.size() && (sc.s[e] == ';' || sc.s[e] == ')');
    struct L { std::string_view label; int field; };
    static constexpr std::array<L, 6> kLabels = {{{"totalcapacity", 0},
                                                 {"alreadyallocated", 1},
                                                 {"free", 2},
                                                 {"cached", 3},
                                                 {"reservedintotalbyPyTorch", 4},
                                                 {"allowed", 5}}};
    int field = -1;
    for (const auto& l : kLabels)
      if (label == l.label) field = l.field;
    if (field < 0 || !closed_label) {
      if (field < 0) {
        bool prefix_of_known = false;
        for (const auto& l : kLabels)
          if (starts_with(l.label, label)) prefix_of_known = true;
        sc.stopped = true;
        sc.hit_end = (e >= sc.s.size()) && prefix_of_known;
        sc.stop_after = r->size.text + " " + std::string(label);
        if (!sc.hit_end) m.warnings.push_back("unknown field '" + std::string(label) + "' in the (GPU ...) list");
        else m.warnings.push_back("the paste is cut inside the field '" + r->size.text + " " + std::string(label) +
                                  "...'; that value is not used");
        return;
      }
      // Known label but the list never closes: keep it, the cut is after it.
    }
    switch (field) {
      case 0: set_size(m.total_capacity, r, m, "total capacity"); break;
      case 1: set_size(m.allocated_by_pytorch, r, m, "already allocated"); break;
      case 2: set_size(m.free, r, m, "free"); break;
      case 3: set_size(m.reserved_unallocated, r, m, "cached"); m.wording = OomWording::Cached; break;
      case 4: set_size(m.reserved_total, r, m, "reserved in total"); break;
      case 5: set_size(m.allowed, r, m, "allowed"); break;
      default: break;
    }
    sc.p = e;
    if (sc.eat(";")) continue;
    if (sc.eat(")")) break;
    sc.fail(")", std::string(label));
  }
}

void parse_sentence_form(Scan& sc, OomMessage& m) {
  // ". GPU n has a total capacity of T of which F is free. <processes>[L allowed; ]Of the allocated
  // memory M is allocated by PyTorch, [with G allocated in private pools (e.g., CUDA Graphs), ]and
  // R is reserved by PyTorch but unallocated."
  m.wording = OomWording::Sentence;
  if (!sc.expect(".GPU", "Tried to allocate")) return;
  if (auto d = sc.integer()) m.device = static_cast<int>(std::min<uint64_t>(*d, 1u << 20));
  if (sc.eat("hasatotalcapactyof")) {
    m.capacity_typo = true;
  } else if (!sc.expect("hasatotalcapacityof", "GPU n")) {
    return;
  }
  set_size(m.total_capacity, sc.size("total capacity"), m, "total capacity");
  if (sc.stopped) return;
  if (sc.eat("ofwhich")) {
    set_size(m.free, sc.size("of which"), m, "free");
    if (!sc.expect("isfree.", "of which ... ")) return;
  } else if (!sc.expect(".", "total capacity")) {
    return;
  }
  while (!sc.stopped) {
    if (sc.eat("Includingnon-PyTorchmemory,thisprocesshas")) {
      auto r = sc.size("this process has");
      if (!r) return;
      OomProcess pr;
      pr.is_self = true;
      pr.used_text = r->size.text;
      if (r->overflow) {
        m.warnings.push_back("this process has " + r->size.text +
                             " memory in use: that is 2^64 bytes, NVML's 'value not available' sentinel "
                             "(seen on Windows/WSL2 WDDM drivers); ignored");
      } else {
        pr.used = r->size;
      }
      m.processes.push_back(pr);
      if (!sc.expect("memoryinuse.", "this process has " + r->size.text)) return;
    } else if (sc.eat("Process")) {
      OomProcess pr;
      pr.pid = sc.integer();
      if (!pr.pid) { sc.fail("0", "Process"); return; }
      if (!sc.expect("has", "Process " + std::to_string(*pr.pid))) return;
      auto r = sc.size("Process " + std::to_string(*pr.pid) + " has");
      if (!r) return;
      pr.used_text = r->size.text;
      if (r->overflow) {
        m.warnings.push_back("process " + std::to_string(*pr.pid) + " is printed with " + r->size.text +
                             " (2^64 bytes, NVML's 'not available' value); ignored");
      } else {
        pr.used = r->size;
      }
      m.processes.push_back(pr);
      if (!sc.expect("memoryinuse.", "Process " + std::to_string(*pr.pid) + " has " + r->size.text)) return;
    } else if (!sc.at_end() && is_digit(sc.s[sc.p])) {
      auto r = sc.size("free");
      if (!r) return;
      if (!sc.expect("allowed;", r->size.text)) return;
      set_size(m.allowed, r, m, "allowed");
    } else if (sc.eat("Oftheallocatedmemory")) {
      set_size(m.allocated_by_pytorch, sc.size("Of the allocated memory"), m, "allocated by PyTorch");
      if (sc.stopped) return;
      if (!sc.expect("isallocatedbyPyTorch,", "Of the allocated memory")) return;
      if (sc.eat("with")) {
        set_size(m.private_pools, sc.size("with"), m, "private pools");
        if (sc.stopped) return;
        if (sc.eat("allocatedinprivatepools(e.g.,HIPGraphs),")) {
          m.graphs_hip = true;
        } else if (!sc.expect("allocatedinprivatepools(e.g.,CUDAGraphs),", "with ... allocated")) {
          return;
        }
      }
      if (!sc.expect("and", "is allocated by PyTorch")) return;
      set_size(m.reserved_unallocated, sc.size("and"), m, "reserved but unallocated");
      if (sc.stopped) return;
      sc.expect("isreservedbyPyTorchbutunallocated.", "and ... is reserved");
      return;  // the numbers are complete
    } else {
      sc.fail("Of the allocated memory", "the process list");
      return;
    }
  }
}

void parse_mps(Scan& sc, OomMessage& m) {
  m.wording = OomWording::Mps;
  if (!sc.expect("MPSbackendoutofmemory(MPSallocated:", "MPS backend out of memory")) return;
  set_size(m.mps_allocated, sc.size("MPS allocated"), m, "MPS allocated");
  if (sc.stopped || !sc.expect(",otherallocations:", "MPS allocated")) return;
  set_size(m.mps_other, sc.size("other allocations"), m, "other allocations");
  if (sc.stopped) return;
  if (sc.eat(",maxallowed:")) {
    set_size(m.mps_max_allowed, sc.size("max allowed"), m, "max allowed");
    if (sc.stopped) return;
  }
  if (!sc.expect(").", "other allocations")) return;
  if (!sc.expect("Triedtoallocate", "(MPS ...)")) return;
  set_size(m.tried_to_allocate, sc.size("Tried to allocate"), m, "Tried to allocate");
  if (sc.stopped) return;
  if (!sc.expect("on", "Tried to allocate")) return;
  if (sc.eat("private")) m.mps_pool = "private";
  else if (sc.eat("shared")) m.mps_pool = "shared";
  else { sc.fail("private", "Tried to allocate ... on"); return; }
  sc.expect("pool.", "on " + m.mps_pool);
}

void read_hints(std::string_view tail, OomMessage& m) {
  tail = tail.substr(0, std::min(tail.size(), kHintChars));
  // The next message or unrelated text may follow; the hints come first, so a short window is enough.
  if (tail.find("max_split_size_mb") != std::string_view::npos) m.hint_max_split = true;
  if (tail.find("expandable_segments") != std::string_view::npos) m.hint_expandable = true;
  if (tail.find("empty_cache") != std::string_view::npos) m.hint_empty_cache = true;
  if (tail.find("PYTORCH_MPS_HIGH_WATERMARK_RATIO") != std::string_view::npos) m.hint_mps_watermark = true;
  size_t best = std::string_view::npos;
  for (std::string_view var : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    size_t at = tail.find(var);
    if (at < best) {
      best = at;
      m.hint_env_var = std::string(var);
    }
  }
  for (std::string_view url : {"https://docs.pytorch.org/", "https://pytorch.org/docs/"}) {
    size_t at = tail.find(url);
    if (at == std::string_view::npos) continue;
    size_t e = at;
    while (e < tail.size() && tail[e] != ')' && e - at < 200) ++e;
    m.docs_url.assign(tail.substr(at, e - at));
    break;
  }
}

void check_values(OomMessage& m) {
  auto over = [&](const std::optional<PrintedSize>& v, std::string_view what) {
    if (!v || !m.total_capacity) return;
    if (v->bytes > m.total_capacity->bytes + m.total_capacity->uncertainty + v->uncertainty)
      m.warnings.push_back(std::string(what) + " (" + v->text + ") exceeds the total capacity (" +
                           m.total_capacity->text +
                           "): impossible on one card; on Windows the driver's system-memory fallback can "
                           "spill into host RAM, so treat the figures as unreliable");
  };
  over(m.allocated_by_pytorch, "allocated by PyTorch");
  over(m.reserved_total, "reserved in total by PyTorch");
  over(m.free, "free memory");
  if (m.allocated_by_pytorch && m.reserved_unallocated && m.total_capacity &&
      m.allocated_by_pytorch->bytes <= m.total_capacity->bytes) {
    uint64_t sum = m.allocated_by_pytorch->bytes + m.reserved_unallocated->bytes;
    if (sum > m.total_capacity->bytes + m.total_capacity->uncertainty * 3)
      m.warnings.push_back("allocated + reserved-but-unallocated (" + std::to_string(sum) +
                           " bytes) exceeds the total capacity (" + m.total_capacity->text + ")");
  }
  uint64_t procs = 0;
  for (const auto& p : m.processes) {
    if (!p.used) continue;
    procs += p.used->bytes;
    if (p.is_self && p.used->bytes == 0)
      m.warnings.push_back("this process is printed with 0 bytes in use: NVML did not report it; ignored");
    else
      over(p.used, p.is_self ? "this process's memory" : "process " + std::to_string(p.pid.value_or(0)) + "'s memory");
  }
  if (m.total_capacity && procs > m.total_capacity->bytes + (m.processes.size() + 1) * m.total_capacity->uncertainty &&
      m.processes.size() > 1)
    m.warnings.push_back("the listed processes together use more than the total capacity");
  if (m.tried_to_allocate && m.tried_to_allocate->bytes > (1ull << 50))
    m.warnings.push_back("Tried to allocate " + m.tried_to_allocate->text +
                         " is more than a petabyte: a shape bug (a wrong or uninitialised dimension), not a "
                         "memory problem");
  if (m.kind == OomKind::Mps && m.mps_allocated && m.mps_max_allowed &&
      m.mps_allocated->bytes > m.mps_max_allowed->bytes + m.mps_max_allowed->uncertainty)
    m.warnings.push_back("MPS allocated exceeds max allowed");
}

}  // namespace

const char* to_string(OomKind kind) {
  switch (kind) {
    case OomKind::Cuda: return "cuda";
    case OomKind::Hip: return "hip";
    case OomKind::Xpu: return "xpu";
    case OomKind::Mps: return "mps";
  }
  return "cuda";
}

std::optional<PrintedSize> parse_printed_size(std::string_view text) {
  std::string sq = squeeze(text);
  auto r = read_size(sq, 0);
  if (!r || r->overflow || r->len != sq.size()) return std::nullopt;
  return r->size;
}

std::string normalize_log_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    size_t e = text.find('\n', i);
    if (e == std::string_view::npos) e = text.size();
    std::string_view line = text.substr(i, e - i);
    append_clean(out, strip_prefixes(line));
    if (!out.empty() && out.back() != ' ') out.push_back(' ');
    i = e + 1;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

Result<OomMessage> parse_oom(std::string_view text, const std::string& source) {
  std::string sq = squeeze(normalize_log_text(text));
  std::string_view s(sq);
  size_t mps_cache = s.find("MPSbackendoutofmemory(");
  auto first = next_anchor(s, 0, mps_cache);
  if (!first) {
    std::string why;
    if (s.find("CUDAerror:outofmemory") != std::string_view::npos)
      why = " (it has 'CUDA error: out of memory', an error from a CUDA call that carries no numbers)";
    else if (s.find("DefaultCPUAllocator:can'tallocatememory") != std::string_view::npos)
      why = " (it has a host-RAM failure from DefaultCPUAllocator, not a GPU one)";
    else if (s.find("RESOURCE_EXHAUSTED:Outofmemory") != std::string_view::npos)
      why = " (it has a JAX/XLA RESOURCE_EXHAUSTED error, not PyTorch's)";
    else if (s.find("iskilledbysignal:Killed") != std::string_view::npos || s.find("oom_kill") != std::string_view::npos)
      why = " (it has a host OOM-killer message: the machine ran out of RAM, not the GPU)";
    return invalid_format("no PyTorch out-of-memory message found in " + source + why);
  }
  // Count the messages and find where the first one ends.
  std::vector<size_t> starts{first->start};
  size_t from = first->tried + 1;
  while (starts.size() < kMaxAnchors) {
    auto a = next_anchor(s, from, mps_cache);
    if (!a) break;
    starts.push_back(a->start);
    from = a->tried + 1;
  }
  size_t end = starts.size() > 1 ? starts[1] : s.size();
  end = std::max(std::min(end, first->start + kWindowChars), first->start);

  OomMessage m;
  m.kind = first->kind;
  m.kind_assumed = first->assumed;
  m.n_messages = starts.size();
  m.exception_type = exception_before(s, first->start);
  if (m.kind_assumed)
    m.warnings.push_back(first->start == first->tried
                             ? "the message's first words are cut off; the (GPU n; ...) shape is CUDA's"
                             : "the message names no device type; read as CUDA's wording");

  Scan sc;
  sc.s = s.substr(first->start, end - first->start);
  if (first->mps) {
    parse_mps(sc, m);
  } else {
    sc.p = first->tried - first->start;
    sc.eat("Triedtoallocate");
    set_size(m.tried_to_allocate, sc.size("Tried to allocate"), m, "Tried to allocate");
    if (!sc.stopped) {
      if (sc.eat("(GPU") || sc.eat("(XPU")) parse_old_form(sc, m);
      else parse_sentence_form(sc, m);
    }
  }
  if (sc.stopped) {
    m.truncated = true;
    m.truncated_after = sc.stop_after;
    if (m.warnings.empty() || m.warnings.back().find("cut inside") == std::string::npos)
      m.warnings.push_back(std::string(sc.hit_end ? "the paste ends" : "the message stops") + " after '" +
                           sc.stop_after + "': the figures that follow it are unknown");
  }
  read_hints(sc.rest(), m);
  if (m.wording == OomWording::Sentence && m.kind == OomKind::Xpu && !m.free && !m.truncated)
    m.warnings.push_back("this XPU build does not print free memory");
  check_values(m);

  // Later copies of the same error are common (retries, the same text in several report fields).
  size_t cmp_len = std::min<size_t>(std::min<size_t>(400, sc.p), end - first->start);
  std::string_view head = s.substr(first->start, cmp_len);
  for (size_t i = 1; i < starts.size() && i < 1000; ++i) {
    std::string_view other = s.substr(starts[i], std::min(cmp_len, s.size() - starts[i]));
    size_t n = std::min(head.size(), other.size());
    if (head.substr(0, n) != other.substr(0, n)) {
      m.messages_differ = true;
      break;
    }
  }
  return m;
}

}  // namespace vlac::diag
