// Strict JSON reading: a SAX handler that builds the DOM while rejecting duplicate keys and
// deep nesting (nlohmann's own parser is iterative, so only our DOM needs a depth bound).
#include "io/json_reader.h"

#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "core/mapped_file.h"

namespace vlac {

bool is_valid_utf8(const uint8_t* data, size_t size, size_t* bad_offset) {
  size_t i = 0;
  while (i < size) {
    uint8_t c = data[i];
    if (c < 0x80) { ++i; continue; }
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1Fu; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0Fu; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07u; min = 0x10000; }
    else { if (bad_offset) *bad_offset = i; return false; }
    if (size - i <= n) { if (bad_offset) *bad_offset = i; return false; }
    for (size_t k = 1; k <= n; ++k) {
      uint8_t cc = data[i + k];
      if ((cc & 0xC0) != 0x80) { if (bad_offset) *bad_offset = i; return false; }
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += n + 1;
  }
  return true;
}

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (out.size() >= max_bytes) { out += "..."; break; }
    auto c = static_cast<uint8_t>(text[i]);
    size_t bad = 0;
    size_t len = c < 0x80 ? 1 : (c >= 0xF0 ? 4 : (c >= 0xE0 ? 3 : 2));
    bool ok_seq = c >= 0x80 && len <= text.size() - i &&
                  is_valid_utf8(reinterpret_cast<const uint8_t*>(text.data()) + i, len, &bad);
    if (c >= 0x20 && c != 0x7F && c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (ok_seq) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
      ++i;
    }
  }
  return out;
}

std::string json_error_text(const std::exception& ex) {
  std::string_view w = ex.what();
  if (!w.empty() && w.front() == '[') {
    size_t close = w.find("] ");
    if (close != std::string_view::npos) w.remove_prefix(close + 2);
  }
  return printable(w, 200);
}

namespace {

using json = nlohmann::json;

class StrictDomSax {
 public:
  explicit StrictDomSax(int max_depth) : max_depth_(max_depth) {}

  bool null() { return place(json(nullptr)) != nullptr; }
  bool boolean(bool v) { return place(json(v)) != nullptr; }
  bool number_integer(json::number_integer_t v) { return place(json(v)) != nullptr; }
  bool number_unsigned(json::number_unsigned_t v) { return place(json(v)) != nullptr; }
  bool number_float(json::number_float_t v, const std::string& /*raw*/) { return place(json(v)) != nullptr; }
  bool string(std::string& v) { return place(json(std::move(v))) != nullptr; }
  bool binary(json::binary_t& /*v*/) { error_ = "binary values are not JSON"; return false; }
  bool start_object(size_t /*n*/) { return open(json::object()); }
  bool start_array(size_t /*n*/) { return open(json::array()); }
  bool end_object() { stack_.pop_back(); keys_.pop_back(); return true; }
  bool end_array() { stack_.pop_back(); keys_.pop_back(); return true; }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second) {
      error_ = "duplicate key '" + printable(k) + "'";
      return false;
    }
    pending_key_ = std::move(k);
    return true;
  }
  bool parse_error(size_t /*pos*/, const std::string& /*tok*/, const nlohmann::detail::exception& ex) {
    error_ = "invalid JSON: " + json_error_text(ex);
    return false;
  }

  json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  bool open(json v) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      error_ = "JSON nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    json* p = place(std::move(v));
    stack_.push_back(p);
    keys_.emplace_back();
    return true;
  }
  // The open containers on the stack receive no other insertion while a child is open, so
  // the pointers to them stay valid (array growth only happens in the innermost one).
  json* place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    auto& obj = top.get_ref<json::object_t&>();
    auto it = obj.emplace(std::move(pending_key_), std::move(v)).first;
    return &it->second;
  }

  int max_depth_;
  json root_;
  std::vector<json*> stack_;
  std::vector<std::set<std::string>> keys_;
  std::string pending_key_;
  std::string error_;
};

}  // namespace

Result<json> parse_json_strict(const uint8_t* data, size_t size, const std::string& path, int max_depth) {
  size_t bad = 0;
  if (!is_valid_utf8(data, size, &bad))
    return invalid_format(path + ": invalid UTF-8 at byte " + std::to_string(bad));
  // nlohmann's lexer takes a NUL byte for the end of input; JSON text never holds a raw NUL.
  if (const void* z = std::memchr(data, 0, size))
    return invalid_format(path + ": NUL byte at byte " + std::to_string(static_cast<const uint8_t*>(z) - data) +
                          " (not JSON text)");
  StrictDomSax sax(max_depth);
  try {
    const char* first = reinterpret_cast<const char*>(data);
    bool ok = json::sax_parse(first, first + size, &sax, json::input_format_t::json, true, false);
    if (!ok) return invalid_format(path + ": " + (sax.error().empty() ? std::string("invalid JSON") : sax.error()));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::ResourceExhausted, path + ": out of memory while parsing JSON");
  } catch (const std::exception& ex) {
    return invalid_format(path + ": invalid JSON: " + json_error_text(ex));
  }
  return std::move(sax.root());
}

Result<json> read_json_file(const std::string& path, uint64_t max_bytes, int max_depth) {
  VLAC_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  if (map.size() > max_bytes)
    return invalid_format(path + ": " + std::to_string(map.size()) + " bytes, more than the " +
                          std::to_string(max_bytes) + "-byte limit for a JSON file");
  if (map.size() == 0) return invalid_format(path + ": empty file (expected JSON)");
  return parse_json_strict(map.data(), map.size(), path, max_depth);
}

}  // namespace vlac
