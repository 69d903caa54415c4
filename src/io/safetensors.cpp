// safetensors reader: a schema-aware SAX pass over the header (no DOM, duplicates seen as they
// come), then size/offset/coverage checks. Reads only the header bytes of the map, never tensor
// data, so opening a huge checkpoint touches a few pages. Never asserts on file bytes.
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "io/json_reader.h"

namespace vlac {

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::numeric_limits<uint64_t>::max();
  }
  return n;
}

namespace {

using json = nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// The header's schema as a state machine over SAX events:
//   { "__metadata__": {str: str, ...}, NAME: {"dtype": str, "shape": [uint...],
//     "data_offsets": [uint, uint]}, ... }
class HeaderSax {
 public:
  explicit HeaderSax(const std::string& path) : path_(path) {}

  bool null() { return unexpected("null"); }
  bool boolean(bool /*v*/) { return unexpected("a boolean"); }
  bool number_float(json::number_float_t /*v*/, const std::string& raw) {
    return unexpected("a non-integer number (" + printable(raw, 40) + ")");
  }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    if (ctx_ == Ctx::Shape) return fail_tensor("shape has a negative dimension (" + std::to_string(v) + ")");
    if (ctx_ == Ctx::Offsets) return fail_tensor("data_offsets has a negative value (" + std::to_string(v) + ")");
    return unexpected("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (ctx_ == Ctx::Shape) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail_tensor("shape dimension " + std::to_string(v) + " is too large");
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (ctx_ == Ctx::Offsets) {
      if (n_offsets_ >= 2) return fail_tensor("data_offsets has more than two values");
      offsets_[n_offsets_++] = v;
      return true;
    }
    return unexpected("a number");
  }
  bool string(std::string& v) {
    if (ctx_ == Ctx::Meta) {
      metadata_.emplace(std::move(meta_key_), std::move(v));
      return true;
    }
    if (ctx_ == Ctx::Entry && field_ == Field::DType) {
      auto dt = dtype_from_name(v);
      if (!dt) return fail_tensor("unknown dtype '" + printable(v, 40) + "'");
      cur_.dtype = *dt;
      return true;
    }
    return unexpected("a string");
  }
  bool binary(json::binary_t& /*v*/) { return unexpected("binary data"); }

  bool start_object(size_t /*n*/) {
    if (ctx_ == Ctx::Start) { ctx_ = Ctx::Top; return true; }
    if (ctx_ == Ctx::Top) {
      if (top_is_meta_) { ctx_ = Ctx::Meta; return true; }
      ctx_ = Ctx::Entry;
      seen_ = 0;
      field_ = Field::None;
      return true;
    }
    return unexpected("an object");
  }
  bool key(std::string& k) {
    if (ctx_ == Ctx::Top) {
      if (!names_.insert(k).second) {
        if (k == "__metadata__") return fail("duplicate __metadata__");
        cur_.name = std::move(k);
        return fail_tensor("duplicate tensor name");
      }
      top_is_meta_ = k == "__metadata__";
      if (!top_is_meta_ && k.empty()) return fail("empty tensor name");
      cur_ = TensorInfo{};
      cur_.name = std::move(k);
      return true;
    }
    if (ctx_ == Ctx::Meta) {
      if (metadata_.count(k)) return fail("__metadata__: duplicate key '" + printable(k) + "'");
      meta_key_ = std::move(k);
      return true;
    }
    // Ctx::Entry (keys only occur in objects, and only Top/Meta/Entry objects are accepted).
    unsigned bit = 0;
    if (k == "dtype") { field_ = Field::DType; bit = 1; }
    else if (k == "shape") { field_ = Field::Shape; bit = 2; }
    else if (k == "data_offsets") { field_ = Field::Offsets; bit = 4; }
    else return fail_tensor("unknown key '" + printable(k, 40) + "' (expected dtype, shape, data_offsets)");
    if (seen_ & bit) return fail_tensor("duplicate key '" + k + "'");
    seen_ |= bit;
    return true;
  }
  bool end_object() {
    if (ctx_ == Ctx::Meta) { ctx_ = Ctx::Top; return true; }
    if (ctx_ == Ctx::Entry) {
      if (!(seen_ & 1)) return fail_tensor("missing 'dtype'");
      if (!(seen_ & 2)) return fail_tensor("missing 'shape'");
      if (!(seen_ & 4)) return fail_tensor("missing 'data_offsets'");
      tensors_.push_back(std::move(cur_));
      cur_ = TensorInfo{};
      ctx_ = Ctx::Top;
      return true;
    }
    ctx_ = Ctx::Done;  // Top
    return true;
  }
  bool start_array(size_t /*n*/) {
    if (ctx_ == Ctx::Entry && field_ == Field::Shape) {
      ctx_ = Ctx::Shape;
      cur_.shape.clear();
      return true;
    }
    if (ctx_ == Ctx::Entry && field_ == Field::Offsets) {
      ctx_ = Ctx::Offsets;
      n_offsets_ = 0;
      return true;
    }
    return unexpected("an array");
  }
  bool end_array() {
    if (ctx_ == Ctx::Offsets) {
      if (n_offsets_ != 2)
        return fail_tensor("data_offsets must have exactly two values, has " + std::to_string(n_offsets_));
      if (offsets_[0] > offsets_[1])
        return fail_tensor("data_offsets begin " + std::to_string(offsets_[0]) + " > end " +
                           std::to_string(offsets_[1]));
      cur_.data_begin = offsets_[0];
      cur_.data_end = offsets_[1];
    }
    ctx_ = Ctx::Entry;  // from Shape or Offsets
    return true;
  }
  bool parse_error(size_t pos, const std::string& /*tok*/, const nlohmann::detail::exception& ex) {
    if (ctx_ == Ctx::Done) return fail("unexpected bytes after the header's JSON object (header byte " +
                                       std::to_string(pos > 0 ? pos - 1 : 0) + ")");
    return fail("header is not valid JSON: " + json_error_text(ex));
  }

  Status status() const { return status_; }
  std::vector<TensorInfo>& tensors() { return tensors_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

 private:
  enum class Ctx { Start, Top, Meta, Entry, Shape, Offsets, Done };
  enum class Field { None, DType, Shape, Offsets };

  bool fail(const std::string& msg) {
    status_ = invalid_format(path_ + ": " + msg);
    return false;
  }
  bool fail_tensor(const std::string& msg) {
    return fail("tensor '" + printable(cur_.name) + "': " + msg);
  }
  bool unexpected(const std::string& what) {
    switch (ctx_) {
      case Ctx::Start: return fail("header is not a JSON object (it is " + what + ")");
      case Ctx::Top:
        if (top_is_meta_) return fail("__metadata__ is not an object (it is " + what + ")");
        return fail_tensor("entry is not an object (it is " + what + ")");
      case Ctx::Meta:
        return fail("__metadata__: value of '" + printable(meta_key_) + "' is not a string (it is " + what + ")");
      case Ctx::Entry:
        if (field_ == Field::DType) return fail_tensor("dtype is not a string (it is " + what + ")");
        if (field_ == Field::Shape) return fail_tensor("shape is not an array (it is " + what + ")");
        return fail_tensor("data_offsets is not an array (it is " + what + ")");
      case Ctx::Shape: return fail_tensor("shape has a value that is not a non-negative integer: " + what);
      case Ctx::Offsets:
        return fail_tensor("data_offsets has a value that is not a non-negative integer: " + what);
      case Ctx::Done: break;
    }
    return fail("unexpected " + what + " after the header object");
  }

  const std::string& path_;
  Status status_;
  Ctx ctx_ = Ctx::Start;
  Field field_ = Field::None;
  bool top_is_meta_ = false;
  unsigned seen_ = 0;
  uint64_t offsets_[2] = {0, 0};
  size_t n_offsets_ = 0;
  TensorInfo cur_;
  std::string meta_key_;
  std::unordered_set<std::string> names_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

Status check_layout(std::vector<TensorInfo>& tensors, uint64_t data_size, const std::string& path) {
  auto tensor_error = [&](const TensorInfo& t, const std::string& msg) {
    return invalid_format(path + ": tensor '" + printable(t.name) + "': " + msg);
  };
  for (const TensorInfo& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (mul_overflow(n, static_cast<uint64_t>(d), &n))
        return tensor_error(t, "shape " + shape_text(t.shape) + " x " + dtype_name(t.dtype) +
                                   " overflows 64 bits");
    }
    if (n != t.nbytes())
      return tensor_error(t, "shape " + shape_text(t.shape) + " x " + dtype_name(t.dtype) + " is " +
                                 std::to_string(n) + " bytes, but data_offsets [" +
                                 std::to_string(t.data_begin) + ", " + std::to_string(t.data_end) +
                                 ") span " + std::to_string(t.nbytes()));
    if (t.data_end > data_size)
      return tensor_error(t, "data_offsets [" + std::to_string(t.data_begin) + ", " +
                                 std::to_string(t.data_end) + ") go beyond the data section (" +
                                 std::to_string(data_size) + " bytes)");
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.data_begin < pos)
      return tensor_error(t, "data_offsets [" + std::to_string(t.data_begin) + ", " +
                                 std::to_string(t.data_end) + ") overlap tensor '" + printable(prev->name) +
                                 "' [" + std::to_string(prev->data_begin) + ", " +
                                 std::to_string(prev->data_end) + ")");
    if (t.data_begin > pos)
      return tensor_error(t, "gap of " + std::to_string(t.data_begin - pos) +
                                 " unused bytes before it (data bytes [" + std::to_string(pos) + ", " +
                                 std::to_string(t.data_begin) + "))");
    pos = t.data_end;
    prev = &t;
  }
  if (pos != data_size)
    return invalid_format(path + ": " + std::to_string(data_size - pos) +
                          " trailing bytes after the last tensor (data section is " +
                          std::to_string(data_size) + " bytes, tensors cover " + std::to_string(pos) + ")");
  return Status::ok();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, uint64_t size,
                                                   const std::string& path) {
  if (size < 8)
    return invalid_format(path + ": file is " + std::to_string(size) +
                          " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian, any host
  if (n > kSafetensorsMaxHeaderBytes)
    return invalid_format(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    return invalid_format(path + ": header length " + std::to_string(n) + " goes beyond the end of the file (" +
                          std::to_string(size) + " bytes)");
  const uint8_t* h = data + 8;
  if (n == 0 || h[0] != '{') return invalid_format(path + ": header does not start with '{'");
  size_t bad = 0;
  if (!is_valid_utf8(h, n, &bad))
    return invalid_format(path + ": header is not valid UTF-8 (header byte " + std::to_string(bad) + ")");
  // nlohmann's lexer takes a NUL byte for the end of input, so "{}\0junk" would pass: no raw NUL
  // may appear anywhere in JSON text.
  if (const void* z = std::memchr(h, 0, n))
    return invalid_format(path + ": header contains a NUL byte (header byte " +
                          std::to_string(static_cast<const uint8_t*>(z) - h) + ")");

  HeaderSax sax(path);
  try {
    const char* first = reinterpret_cast<const char*>(h);
    if (!json::sax_parse(first, first + n, &sax, json::input_format_t::json, true, false)) {
      Status st = sax.status();
      if (st.is_ok()) st = invalid_format(path + ": header is not valid JSON");
      return st;
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::ResourceExhausted, path + ": out of memory while parsing the header");
  } catch (const std::exception& ex) {
    return invalid_format(path + ": header is not valid JSON: " + json_error_text(ex));
  }

  SafetensorsHeader out;
  out.data_offset = 8 + n;
  out.tensors = std::move(sax.tensors());
  out.metadata = std::move(sax.metadata());
  VLAC_RETURN_IF_ERROR(check_layout(out.tensors, size - out.data_offset, path));
  return out;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  VLAC_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  VLAC_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors_header(map.data(), map.size(), path));
  SafetensorsFile f(std::move(map), std::move(header));
  f.by_name_.resize(f.header_.tensors.size());
  for (size_t i = 0; i < f.by_name_.size(); ++i) f.by_name_[i] = i;
  const auto& ts = f.header_.tensors;
  std::sort(f.by_name_.begin(), f.by_name_.end(),
            [&ts](size_t a, size_t b) { return ts[a].name < ts[b].name; });
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto& ts = header_.tensors;
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&ts](size_t i, std::string_view n) { return ts[i].name < n; });
  if (it == by_name_.end() || ts[*it].name != name) return nullptr;
  return &ts[*it];
}

}  // namespace vlac
