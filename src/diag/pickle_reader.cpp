// Pickle reader: an explicit stack machine over the opcode stream (pickletools' opcode table).
// Must not execute, import or resolve anything, recurse on input nesting, or trust a length.
#include "diag/pickle_reader.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace vlac {

namespace {

constexpr PickleId kNoId = std::numeric_limits<PickleId>::max();

struct OpInfo {
  uint8_t code;
  const char* name;
};

// Every opcode of protocols 0-5 (Lib/pickletools.py).
constexpr OpInfo kOps[] = {
    {'(', "MARK"},           {'.', "STOP"},          {'0', "POP"},
    {'1', "POP_MARK"},       {'2', "DUP"},           {'F', "FLOAT"},
    {'I', "INT"},            {'J', "BININT"},        {'K', "BININT1"},
    {'L', "LONG"},           {'M', "BININT2"},       {'N', "NONE"},
    {'P', "PERSID"},         {'Q', "BINPERSID"},     {'R', "REDUCE"},
    {'S', "STRING"},         {'T', "BINSTRING"},     {'U', "SHORT_BINSTRING"},
    {'V', "UNICODE"},        {'X', "BINUNICODE"},    {'a', "APPEND"},
    {'b', "BUILD"},          {'c', "GLOBAL"},        {'d', "DICT"},
    {'}', "EMPTY_DICT"},     {'e', "APPENDS"},       {'g', "GET"},
    {'h', "BINGET"},         {'i', "INST"},          {'j', "LONG_BINGET"},
    {'l', "LIST"},           {']', "EMPTY_LIST"},    {'o', "OBJ"},
    {'p', "PUT"},            {'q', "BINPUT"},        {'r', "LONG_BINPUT"},
    {'s', "SETITEM"},        {'t', "TUPLE"},         {')', "EMPTY_TUPLE"},
    {'u', "SETITEMS"},       {'G', "BINFLOAT"},      {0x80, "PROTO"},
    {0x81, "NEWOBJ"},        {0x82, "EXT1"},         {0x83, "EXT2"},
    {0x84, "EXT4"},          {0x85, "TUPLE1"},       {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},        {0x88, "NEWTRUE"},      {0x89, "NEWFALSE"},
    {0x8a, "LONG1"},         {0x8b, "LONG4"},        {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"}, {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"},
    {0x8e, "BINBYTES8"},     {0x8f, "EMPTY_SET"},    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},     {0x92, "NEWOBJ_EX"},    {0x93, "STACK_GLOBAL"},
    {0x94, "MEMOIZE"},       {0x95, "FRAME"},        {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},   {0x98, "READONLY_BUFFER"},
};

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

// Decodes UTF-8 into code points <= 255 (for protocol-2 bytes: _codecs.encode(s, 'latin1')).
bool utf8_to_latin1(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      uint32_t cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
      if (cp > 0xFF) return false;
      out->push_back(static_cast<char>(cp));
      i += 2;
    } else {
      return false;
    }
  }
  return true;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Protocol-0 UNICODE text is raw-unicode-escape: bytes are latin-1 code points, \uXXXX and
// \UXXXXXXXX are escapes. Returns UTF-8.
std::string raw_unicode_escape_to_utf8(const std::string& s) {
  std::string out;
  auto hex = [&](size_t at, int n, uint32_t* cp) {
    if (at + n > s.size()) return false;
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      char c = s[at + i];
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + static_cast<uint32_t>(d);
    }
    *cp = v;
    return true;
  };
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'u' && hex(i + 2, 4, &cp)) {
      i += 6;
    } else if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'U' && hex(i + 2, 8, &cp) && cp <= 0x10FFFF) {
      i += 10;
    } else {
      cp = static_cast<uint8_t>(s[i]);
      i += 1;
    }
    append_utf8(cp, &out);
  }
  return out;
}

}  // namespace

const char* pickle_opcode_name(uint8_t op) {
  for (const OpInfo& o : kOps)
    if (o.code == op) return o.name;
  return nullptr;
}

const char* to_string(PickleKind kind) {
  switch (kind) {
    case PickleKind::None: return "None";
    case PickleKind::Bool: return "bool";
    case PickleKind::Int: return "int";
    case PickleKind::Float: return "float";
    case PickleKind::Str: return "str";
    case PickleKind::Bytes: return "bytes";
    case PickleKind::List: return "list";
    case PickleKind::Tuple: return "tuple";
    case PickleKind::Dict: return "dict";
    case PickleKind::Set: return "set";
    case PickleKind::Global: return "global";
    case PickleKind::Object: return "object";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// PickleDoc accessors

std::optional<int64_t> PickleDoc::as_int(PickleId id) const {
  if (id >= nodes_.size()) return std::nullopt;
  const Node& n = nodes_[id];
  if (n.kind == PickleKind::Int || n.kind == PickleKind::Bool) return n.i;
  return std::nullopt;
}

std::optional<double> PickleDoc::as_number(PickleId id) const {
  if (id >= nodes_.size()) return std::nullopt;
  const Node& n = nodes_[id];
  if (n.kind == PickleKind::Int || n.kind == PickleKind::Bool) return static_cast<double>(n.i);
  if (n.kind == PickleKind::Float) return n.f;
  return std::nullopt;
}

std::optional<bool> PickleDoc::as_bool(PickleId id) const {
  if (id >= nodes_.size()) return std::nullopt;
  const Node& n = nodes_[id];
  if (n.kind == PickleKind::Bool || n.kind == PickleKind::Int) return n.i != 0;
  return std::nullopt;
}

const std::string* PickleDoc::as_text(PickleId id) const {
  if (id >= nodes_.size()) return nullptr;
  const Node& n = nodes_[id];
  switch (n.kind) {
    case PickleKind::Str:
    case PickleKind::Bytes:
    case PickleKind::Global:
    case PickleKind::Object: return &n.text;
    default: return nullptr;
  }
}

const std::string* PickleDoc::as_str(PickleId id) const {
  if (id >= nodes_.size() || nodes_[id].kind != PickleKind::Str) return nullptr;
  return &nodes_[id].text;
}

std::span<const PickleId> PickleDoc::items(PickleId id) const {
  if (id >= nodes_.size()) return {};
  return nodes_[id].items;
}

std::optional<PickleId> PickleDoc::get(PickleId dict, std::string_view key) const {
  if (dict >= nodes_.size() || nodes_[dict].kind != PickleKind::Dict) return std::nullopt;
  const std::vector<PickleId>& it = nodes_[dict].items;
  for (size_t i = it.size(); i >= 2; i -= 2) {
    const std::string* k = as_str(it[i - 2]);
    if (k && *k == key) return it[i - 1];
  }
  return std::nullopt;
}

std::string PickleDoc::repr(PickleId id, int max_depth, int max_items) const {
  if (id >= nodes_.size()) return "<bad id>";
  const Node& n = nodes_[id];
  auto quoted = [](const std::string& s) {
    std::string out = "'";
    for (char c : s.substr(0, 200)) out += (c == '\'' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    if (s.size() > 200) out += "...";
    return out + "'";
  };
  switch (n.kind) {
    case PickleKind::None: return "None";
    case PickleKind::Bool: return n.i ? "True" : "False";
    case PickleKind::Int: return std::to_string(n.i);
    case PickleKind::Float: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", n.f);
      return buf;
    }
    case PickleKind::Str: return quoted(n.text);
    case PickleKind::Bytes: return "b" + quoted(n.text);
    case PickleKind::Global: return "<global " + n.text + ">";
    default: break;
  }
  if (max_depth <= 0) return "...";
  std::string open, close;
  switch (n.kind) {
    case PickleKind::List: open = "["; close = "]"; break;
    case PickleKind::Tuple: open = "("; close = ")"; break;
    case PickleKind::Set: open = "{"; close = "}"; break;
    case PickleKind::Dict: open = "{"; close = "}"; break;
    default: open = "<object " + n.text + " "; close = ">"; break;
  }
  std::string out = open;
  size_t step = n.kind == PickleKind::Dict ? 2 : 1;
  size_t shown = 0;
  for (size_t i = 0; i + step <= n.items.size(); i += step) {
    if (shown == static_cast<size_t>(max_items)) {
      out += ", ...";
      break;
    }
    if (shown) out += ", ";
    out += repr(n.items[i], max_depth - 1, max_items);
    if (step == 2) out += ": " + repr(n.items[i + 1], max_depth - 1, max_items);
    ++shown;
  }
  return out + close;
}

// ---------------------------------------------------------------------------------------------
// The parser

class PickleParser {
 public:
  PickleParser(std::span<const uint8_t> in, const PickleLimits& limits) : in_(in), lim_(limits) {}

  Result<PickleDoc> run() {
    if (in_.size() > lim_.max_input_bytes)
      return invalid_format("pickle: " + std::to_string(in_.size()) + " bytes is over the limit of " +
                            std::to_string(lim_.max_input_bytes));
    if (in_.empty()) return invalid_format("pickle: truncated: empty input at offset 0");
    while (true) {
      if (pos_ >= in_.size())
        return fail_at(in_.size(), 0, "truncated: input ends before the STOP opcode");
      op_pos_ = pos_;
      op_ = in_[pos_++];
      Status st = step();
      if (!st.is_ok()) return st;
      if (done_) break;
    }
    return std::move(doc_);
  }

 private:
  using Node = PickleDoc::Node;

  // --- errors ---
  Status fail_at(size_t offset, uint8_t op, const std::string& what) const {
    const char* name = pickle_opcode_name(op);
    std::string where = "at offset " + std::to_string(offset);
    if (offset < in_.size() || op != 0) where += " in " + (name ? std::string(name) : "opcode " + hex_byte(op));
    return invalid_format("pickle: " + what + " " + where);
  }
  Status fail(const std::string& what) const { return fail_at(op_pos_, op_, what); }

  // --- input ---
  Status need(uint64_t n) const {
    if (n > in_.size() - pos_)
      return fail("truncated: needs " + std::to_string(n) + " bytes, " + std::to_string(in_.size() - pos_) + " left");
    return Status::ok();
  }
  uint64_t read_le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += n;
    return v;
  }
  Status read_uint(int n, uint64_t* v) {
    VLAC_RETURN_IF_ERROR(need(n));
    *v = read_le(n);
    return Status::ok();
  }
  Status read_line(std::string* out) {
    const uint8_t* start = in_.data() + pos_;
    const void* nl = std::memchr(start, '\n', in_.size() - pos_);
    if (!nl) return fail("truncated: no end of line");
    size_t len = static_cast<const uint8_t*>(nl) - start;
    out->assign(reinterpret_cast<const char*>(start), len);
    pos_ += len + 1;
    return Status::ok();
  }
  Status read_blob(uint64_t len, std::string* out) {
    VLAC_RETURN_IF_ERROR(need(len));
    out->assign(reinterpret_cast<const char*>(in_.data() + pos_), len);
    pos_ += len;
    return Status::ok();
  }

  // --- values ---
  Result<PickleId> make(PickleKind kind) {
    if (doc_.nodes_.size() >= lim_.max_objects)
      return fail("too many values (limit " + std::to_string(lim_.max_objects) + ")");
    doc_.nodes_.emplace_back();
    doc_.nodes_.back().kind = kind;
    if (kind == PickleKind::Global || kind == PickleKind::Object) ++doc_.n_opaque_;
    return static_cast<PickleId>(doc_.nodes_.size() - 1);
  }
  Node& node(PickleId id) { return doc_.nodes_[id]; }

  Status push(PickleId id) {
    if (stack_.size() >= lim_.max_stack) return fail("stack too deep (limit " + std::to_string(lim_.max_stack) + ")");
    stack_.push_back(id);
    return Status::ok();
  }
  Status push_new(PickleKind kind, PickleId* out = nullptr) {
    VLAC_ASSIGN_OR_RETURN(PickleId id, make(kind));
    if (out) *out = id;
    return push(id);
  }
  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  Status pop(PickleId* out) {
    if (stack_.size() <= base()) return fail("stack underflow");
    *out = stack_.back();
    stack_.pop_back();
    return Status::ok();
  }
  Status top(PickleId* out) const {
    if (stack_.size() <= base()) return fail("stack underflow");
    *out = stack_.back();
    return Status::ok();
  }
  // Moves the items above the last MARK into `out` and drops the mark.
  Status pop_mark(std::vector<PickleId>* out) {
    if (marks_.empty()) return fail("no MARK on the stack");
    size_t b = marks_.back();
    marks_.pop_back();
    out->assign(stack_.begin() + static_cast<ptrdiff_t>(b), stack_.end());
    stack_.resize(b);
    return Status::ok();
  }

  Status push_int(int64_t v) {
    PickleId id = 0;
    VLAC_RETURN_IF_ERROR(push_new(PickleKind::Int, &id));
    node(id).i = v;
    return Status::ok();
  }
  Status push_float(double v, bool lossy = false) {
    PickleId id = 0;
    VLAC_RETURN_IF_ERROR(push_new(PickleKind::Float, &id));
    node(id).f = v;
    node(id).lossy = lossy;
    return Status::ok();
  }
  Status push_text(PickleKind kind, std::string text) {
    PickleId id = 0;
    VLAC_RETURN_IF_ERROR(push_new(kind, &id));
    node(id).text = std::move(text);
    return Status::ok();
  }
  Status push_container(PickleKind kind, std::vector<PickleId> items) {
    PickleId id = 0;
    VLAC_RETURN_IF_ERROR(push_new(kind, &id));
    node(id).items = std::move(items);
    return Status::ok();
  }

  // Little-endian two's complement of `n` bytes (LONG1/LONG4).
  Status push_long_bytes(uint64_t n) {
    VLAC_RETURN_IF_ERROR(need(n));
    const uint8_t* p = in_.data() + pos_;
    pos_ += n;
    if (n == 0) return push_int(0);
    bool negative = (p[n - 1] & 0x80) != 0;
    // Significant length: drop redundant sign-extension bytes at the top.
    uint64_t sig = n;
    while (sig > 1 && p[sig - 1] == (negative ? 0xFF : 0x00) &&
           ((p[sig - 2] & 0x80) != 0) == negative)
      --sig;
    if (sig <= 8) {
      uint64_t u = 0;
      for (uint64_t i = 0; i < 8; ++i) {
        uint8_t b = i < sig ? p[i] : (negative ? 0xFF : 0x00);
        u |= static_cast<uint64_t>(b) << (8 * i);
      }
      return push_int(static_cast<int64_t>(u));
    }
    // Too big for int64: keep an approximation from the top 8 significant bytes.
    double v = 0;
    uint64_t lo = sig > 16 ? sig - 16 : 0;
    for (uint64_t i = sig; i-- > lo;) v = v * 256.0 + static_cast<double>(negative ? 0xFF - p[i] : p[i]);
    v = std::ldexp(v, static_cast<int>(std::min<uint64_t>(lo * 8, 4096)));
    if (negative) v = -(v + 1);
    if (!std::isfinite(v)) v = negative ? -HUGE_VAL : HUGE_VAL;
    return push_float(v, /*lossy=*/true);
  }

  Status push_decimal(const std::string& text) {
    std::string t = text;
    if (!t.empty() && t.back() == 'L') t.pop_back();
    if (t.empty()) return fail("empty integer");
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(t.c_str(), &end, 10);
    if (end == t.c_str() || *end != '\0') return fail("bad integer text");
    if (errno == ERANGE) return push_float(std::strtod(t.c_str(), nullptr), true);
    return push_int(v);
  }

  // --- memo ---
  Status memo_put(uint64_t index) {
    PickleId v = 0;
    VLAC_RETURN_IF_ERROR(top(&v));
    if (index >= lim_.max_memo) return fail("memo index " + std::to_string(index) + " over the limit");
    if (index >= memo_.size()) memo_.resize(index + 1, kNoId);
    if (memo_[index] == kNoId) ++memo_count_;
    memo_[index] = v;
    return Status::ok();
  }
  Status memo_get(uint64_t index) {
    if (index >= memo_.size() || memo_[index] == kNoId)
      return fail("memo reference " + std::to_string(index) + " was never stored");
    return push(memo_[index]);
  }

  // --- the inert replacements for code execution ---
  Status push_object(PickleId callable, PickleId args, PickleId state = kNoId) {
    std::string name = node(callable).kind == PickleKind::Global ? node(callable).text : std::string("<") + to_string(node(callable).kind) + ">";
    const std::vector<PickleId> arg_items =
        node(args).kind == PickleKind::Tuple ? node(args).items : std::vector<PickleId>{};
    // Harmless constructors of plain data become that data.
    if (name == "collections.OrderedDict" && arg_items.empty()) return push_new(PickleKind::Dict);
    if ((name == "builtins.set" || name == "builtins.frozenset" || name == "__builtin__.set" ||
         name == "__builtin__.frozenset") &&
        arg_items.size() == 1 && node(arg_items[0]).kind == PickleKind::List)
      return push_container(PickleKind::Set, node(arg_items[0]).items);
    if (name == "_codecs.encode" && arg_items.size() == 2 && node(arg_items[0]).kind == PickleKind::Str &&
        node(arg_items[1]).kind == PickleKind::Str &&
        (node(arg_items[1]).text == "latin1" || node(arg_items[1]).text == "latin-1")) {
      std::string bytes;
      if (utf8_to_latin1(node(arg_items[0]).text, &bytes)) return push_text(PickleKind::Bytes, std::move(bytes));
    }
    bool is_bytearray = name == "builtins.bytearray" || name == "__builtin__.bytearray";
    if (is_bytearray && arg_items.size() == 1 && node(arg_items[0]).kind == PickleKind::Bytes)
      return push_text(PickleKind::Bytes, node(arg_items[0]).text);
    if (is_bytearray && arg_items.size() == 0) return push_text(PickleKind::Bytes, "");
    if (is_bytearray && arg_items.size() == 2 && node(arg_items[0]).kind == PickleKind::Str &&
        node(arg_items[1]).kind == PickleKind::Str &&
        (node(arg_items[1]).text == "latin1" || node(arg_items[1]).text == "latin-1")) {
      std::string bytes;
      if (utf8_to_latin1(node(arg_items[0]).text, &bytes)) return push_text(PickleKind::Bytes, std::move(bytes));
    }
    VLAC_ASSIGN_OR_RETURN(PickleId none, make(PickleKind::None));
    PickleId id = 0;
    VLAC_RETURN_IF_ERROR(push_new(PickleKind::Object, &id));
    node(id).text = std::move(name);
    node(id).items = {args, state == kNoId ? none : state};
    return Status::ok();
  }
  Status push_global(std::string module, const std::string& name) {
    return push_text(PickleKind::Global, std::move(module) + "." + name);
  }

  Status append_to(PickleId target, const std::vector<PickleId>& values) {
    PickleKind k = node(target).kind;
    if (k == PickleKind::List || (k == PickleKind::Set && (op_ == 0x90))) {
      std::vector<PickleId>& items = node(target).items;
      items.insert(items.end(), values.begin(), values.end());
      return Status::ok();
    }
    if (k == PickleKind::Object) return Status::ok();  // would call obj.append/extend: dropped
    return fail(std::string("cannot add items to a ") + to_string(k));
  }
  Status set_items(PickleId target, const std::vector<PickleId>& kv) {
    if (kv.size() % 2 != 0) return fail("odd number of items for a dict");
    PickleKind k = node(target).kind;
    if (k == PickleKind::Dict) {
      std::vector<PickleId>& items = node(target).items;
      items.insert(items.end(), kv.begin(), kv.end());
      return Status::ok();
    }
    if (k == PickleKind::Object) return Status::ok();  // would call obj.__setitem__: dropped
    return fail(std::string("cannot set items on a ") + to_string(k));
  }

  Status step();

  std::span<const uint8_t> in_;
  PickleLimits lim_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  bool done_ = false;
  PickleDoc doc_;
  std::vector<PickleId> stack_;
  std::vector<size_t> marks_;
  std::vector<PickleId> memo_;
  uint64_t memo_count_ = 0;
  std::vector<PickleId> scratch_;
};

Status PickleParser::step() {
  uint64_t u = 0;
  std::string s, s2;
  PickleId a = 0, b = 0, c = 0;
  switch (op_) {
    // --- framing and control ---
    case 0x80:  // PROTO
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      if (u > 5) return fail("unsupported pickle protocol " + std::to_string(u));
      return Status::ok();
    case 0x95:  // FRAME: a length prefix only; opcodes continue inline
      VLAC_RETURN_IF_ERROR(read_uint(8, &u));
      if (u > in_.size() - pos_) return fail("truncated: frame of " + std::to_string(u) + " bytes, " + std::to_string(in_.size() - pos_) + " left");
      return Status::ok();
    case '.':  // STOP
      if (!marks_.empty()) return fail("STOP with an open MARK");
      if (stack_.empty()) return fail("STOP with an empty stack");
      doc_.root_ = stack_.back();
      done_ = true;
      return Status::ok();
    case '(':  // MARK
      if (marks_.size() >= lim_.max_depth) return fail("nesting deeper than " + std::to_string(lim_.max_depth));
      marks_.push_back(stack_.size());
      return Status::ok();
    case '0':  // POP
      if (stack_.size() > base()) {
        stack_.pop_back();
        return Status::ok();
      }
      if (!marks_.empty()) {
        marks_.pop_back();
        return Status::ok();
      }
      return fail("stack underflow");
    case '1':  // POP_MARK
      return pop_mark(&scratch_);
    case '2':  // DUP
      VLAC_RETURN_IF_ERROR(top(&a));
      return push(a);

    // --- scalars ---
    case 'N': return push_new(PickleKind::None);
    case 0x88:
    case 0x89: {  // NEWTRUE / NEWFALSE
      VLAC_RETURN_IF_ERROR(push_new(PickleKind::Bool, &a));
      node(a).i = op_ == 0x88 ? 1 : 0;
      return Status::ok();
    }
    case 'J':  // BININT: signed 4 bytes
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      return push_int(static_cast<int32_t>(static_cast<uint32_t>(u)));
    case 'K':
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      return push_int(static_cast<int64_t>(u));
    case 'M':
      VLAC_RETURN_IF_ERROR(read_uint(2, &u));
      return push_int(static_cast<int64_t>(u));
    case 0x8a:  // LONG1
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      return push_long_bytes(u);
    case 0x8b: {  // LONG4: signed length
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      int32_t n = static_cast<int32_t>(static_cast<uint32_t>(u));
      if (n < 0) return fail("negative LONG4 length");
      return push_long_bytes(static_cast<uint64_t>(n));
    }
    case 'I': {  // INT (text); "00"/"01" are protocol-0 booleans
      VLAC_RETURN_IF_ERROR(read_line(&s));
      if (s == "00" || s == "01") {
        VLAC_RETURN_IF_ERROR(push_new(PickleKind::Bool, &a));
        node(a).i = s == "01";
        return Status::ok();
      }
      return push_decimal(s);
    }
    case 'L':
      VLAC_RETURN_IF_ERROR(read_line(&s));
      return push_decimal(s);
    case 'F': {
      VLAC_RETURN_IF_ERROR(read_line(&s));
      char* end = nullptr;
      double v = std::strtod(s.c_str(), &end);
      if (s.empty() || end == s.c_str()) return fail("bad float text");
      return push_float(v);
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      VLAC_RETURN_IF_ERROR(need(8));
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | in_[pos_ + i];
      pos_ += 8;
      double v;
      std::memcpy(&v, &bits, sizeof v);
      return push_float(v);
    }

    // --- strings and bytes ---
    case 'X':
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Str, std::move(s));
    case 0x8c:
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Str, std::move(s));
    case 0x8d:
      VLAC_RETURN_IF_ERROR(read_uint(8, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Str, std::move(s));
    case 'V':  // UNICODE (raw-unicode-escape text)
      VLAC_RETURN_IF_ERROR(read_line(&s));
      return push_text(PickleKind::Str, raw_unicode_escape_to_utf8(s));
    case 'B':
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Bytes, std::move(s));
    case 'C':
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Bytes, std::move(s));
    case 0x8e:
    case 0x96:  // BINBYTES8 / BYTEARRAY8
      VLAC_RETURN_IF_ERROR(read_uint(8, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Bytes, std::move(s));
    case 'T': {  // BINSTRING: signed 4-byte length
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      int32_t n = static_cast<int32_t>(static_cast<uint32_t>(u));
      if (n < 0) return fail("negative BINSTRING length");
      VLAC_RETURN_IF_ERROR(read_blob(static_cast<uint64_t>(n), &s));
      return push_text(PickleKind::Str, std::move(s));
    }
    // Python 2 str opcodes: Python 3 loads them as str by default (encoding="ASCII"), so do we.
    case 'U':
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      VLAC_RETURN_IF_ERROR(read_blob(u, &s));
      return push_text(PickleKind::Str, std::move(s));
    case 'S': {  // STRING: a quoted repr; the quotes are stripped, escapes kept
      VLAC_RETURN_IF_ERROR(read_line(&s));
      if (s.size() < 2 || (s.front() != '\'' && s.front() != '"') || s.back() != s.front())
        return fail("STRING is not quoted");
      return push_text(PickleKind::Str, s.substr(1, s.size() - 2));
    }

    // --- containers ---
    case ']': return push_new(PickleKind::List);
    case '}': return push_new(PickleKind::Dict);
    case ')': return push_new(PickleKind::Tuple);
    case 0x8f: return push_new(PickleKind::Set);
    case 'l':
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      return push_container(PickleKind::List, scratch_);
    case 't':
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      return push_container(PickleKind::Tuple, scratch_);
    case 0x91:
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      return push_container(PickleKind::Set, scratch_);
    case 'd':
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      if (scratch_.size() % 2) return fail("odd number of items for a dict");
      return push_container(PickleKind::Dict, scratch_);
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1/2/3
      size_t n = op_ - 0x84u;
      if (stack_.size() < base() + n) return fail("stack underflow");
      std::vector<PickleId> items(stack_.end() - static_cast<ptrdiff_t>(n), stack_.end());
      stack_.resize(stack_.size() - n);
      return push_container(PickleKind::Tuple, std::move(items));
    }
    case 'a':  // APPEND
      VLAC_RETURN_IF_ERROR(pop(&a));
      VLAC_RETURN_IF_ERROR(top(&b));
      return append_to(b, {a});
    case 'e':  // APPENDS
    case 0x90:  // ADDITEMS
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      VLAC_RETURN_IF_ERROR(top(&b));
      return append_to(b, scratch_);
    case 's':  // SETITEM
      VLAC_RETURN_IF_ERROR(pop(&a));
      VLAC_RETURN_IF_ERROR(pop(&c));
      VLAC_RETURN_IF_ERROR(top(&b));
      return set_items(b, {c, a});
    case 'u':  // SETITEMS
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      VLAC_RETURN_IF_ERROR(top(&b));
      return set_items(b, scratch_);

    // --- memo ---
    case 'p':
      VLAC_RETURN_IF_ERROR(read_line(&s));
      u = std::strtoull(s.c_str(), nullptr, 10);
      return memo_put(u);
    case 'q':
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      return memo_put(u);
    case 'r':
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      return memo_put(u);
    case 0x94:  // MEMOIZE: index = number of memo entries so far
      return memo_put(memo_count_);
    case 'g':
      VLAC_RETURN_IF_ERROR(read_line(&s));
      u = std::strtoull(s.c_str(), nullptr, 10);
      return memo_get(u);
    case 'h':
      VLAC_RETURN_IF_ERROR(read_uint(1, &u));
      return memo_get(u);
    case 'j':
      VLAC_RETURN_IF_ERROR(read_uint(4, &u));
      return memo_get(u);

    // --- everything that would import or call: inert values ---
    case 'c':  // GLOBAL module\nname\n
      VLAC_RETURN_IF_ERROR(read_line(&s));
      VLAC_RETURN_IF_ERROR(read_line(&s2));
      return push_global(std::move(s), s2);
    case 0x93: {  // STACK_GLOBAL
      VLAC_RETURN_IF_ERROR(pop(&b));
      VLAC_RETURN_IF_ERROR(pop(&a));
      const std::string* mod = doc_.as_str(a);
      const std::string* name = doc_.as_str(b);
      if (!mod || !name) return fail("STACK_GLOBAL needs two strings");
      return push_global(*mod, *name);
    }
    case 0x82:
    case 0x83:
    case 0x84:  // EXT1/2/4: the copyreg extension registry
      VLAC_RETURN_IF_ERROR(read_uint(op_ == 0x82 ? 1 : op_ == 0x83 ? 2 : 4, &u));
      return push_text(PickleKind::Global, "copyreg.extension_" + std::to_string(u));
    case 'R':  // REDUCE: callable(*args) -> inert object
      VLAC_RETURN_IF_ERROR(pop(&b));
      VLAC_RETURN_IF_ERROR(pop(&a));
      return push_object(a, b);
    case 0x81:  // NEWOBJ: cls.__new__(cls, *args)
      VLAC_RETURN_IF_ERROR(pop(&b));
      VLAC_RETURN_IF_ERROR(pop(&a));
      return push_object(a, b);
    case 0x92:  // NEWOBJ_EX: kwargs kept as the state slot
      VLAC_RETURN_IF_ERROR(pop(&c));
      VLAC_RETURN_IF_ERROR(pop(&b));
      VLAC_RETURN_IF_ERROR(pop(&a));
      return push_object(a, b, c);
    case 'b': {  // BUILD: state goes into an Object's state slot; ignored elsewhere
      VLAC_RETURN_IF_ERROR(pop(&a));
      VLAC_RETURN_IF_ERROR(top(&b));
      if (node(b).kind == PickleKind::Object && node(b).items.size() == 2) node(b).items[1] = a;
      return Status::ok();
    }
    case 'i': {  // INST module\nname\n with args above the mark
      VLAC_RETURN_IF_ERROR(read_line(&s));
      VLAC_RETURN_IF_ERROR(read_line(&s2));
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      std::vector<PickleId> args = scratch_;
      VLAC_RETURN_IF_ERROR(push_global(std::move(s), s2));
      VLAC_RETURN_IF_ERROR(pop(&a));
      VLAC_RETURN_IF_ERROR(push_container(PickleKind::Tuple, std::move(args)));
      VLAC_RETURN_IF_ERROR(pop(&b));
      return push_object(a, b);
    }
    case 'o': {  // OBJ: class and args above the mark
      VLAC_RETURN_IF_ERROR(pop_mark(&scratch_));
      if (scratch_.empty()) return fail("OBJ without a class");
      a = scratch_[0];
      std::vector<PickleId> args(scratch_.begin() + 1, scratch_.end());
      VLAC_RETURN_IF_ERROR(push_container(PickleKind::Tuple, std::move(args)));
      VLAC_RETURN_IF_ERROR(pop(&b));
      return push_object(a, b);
    }
    case 'P': {  // PERSID: persistent id text
      VLAC_RETURN_IF_ERROR(read_line(&s));
      VLAC_RETURN_IF_ERROR(push_text(PickleKind::Global, "pickle.persistent_load"));
      VLAC_RETURN_IF_ERROR(pop(&a));
      VLAC_RETURN_IF_ERROR(push_text(PickleKind::Str, std::move(s)));
      VLAC_RETURN_IF_ERROR(pop(&b));
      return push_object(a, b);
    }
    case 'Q':  // BINPERSID
      VLAC_RETURN_IF_ERROR(pop(&b));
      VLAC_RETURN_IF_ERROR(push_text(PickleKind::Global, "pickle.persistent_load"));
      VLAC_RETURN_IF_ERROR(pop(&a));
      return push_object(a, b);
    case 0x97:  // NEXT_BUFFER
      return fail("out-of-band buffers are not supported");
    case 0x98:  // READONLY_BUFFER
      return top(&a);
    default:
      return fail("unknown opcode");
  }
}

Result<PickleDoc> read_pickle(std::span<const uint8_t> bytes, const PickleLimits& limits) {
  PickleParser p(bytes, limits);
  return p.run();
}

}  // namespace vlac
