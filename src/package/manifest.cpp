// Manifest JSON: strict parse (duplicates, depth, NUL) and schema decode; the writer runs the
// same checks on what it is about to write, so it never writes a package the reader rejects.
#include "package/manifest.h"

#include <cstring>
#include <set>
#include <unordered_set>

#include "core/bytes.h"

namespace vlac {

using json = nlohmann::json;
using package::printable_name;
using package::SegmentKind;

namespace {

std::string strip_json_prefix(const char* what) {
  std::string s = what;
  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> after "] ".
  if (!s.empty() && s[0] == '[') {
    auto p = s.find("] ");
    if (p != std::string::npos) s = s.substr(p + 2);
  }
  return printable_name(s.size() > 200 ? s.substr(0, 200) : s);
}

class Ctx {
 public:
  explicit Ctx(const std::string& path) : path_(path) {}
  Status bad(const std::string& where, const std::string& what) const {
    return invalid_format(path_ + ": manifest: " + where + ": " + what);
  }
  const std::string& path() const { return path_; }

 private:
  const std::string& path_;
};

Status get_string(const Ctx& c, const json& obj, const char* key, const std::string& where, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return c.bad(where, std::string("missing key \"") + key + "\"");
  if (!it->is_string()) return c.bad(where, std::string("\"") + key + "\" must be a string");
  *out = it->get_ref<const std::string&>();
  return Status::ok();
}

Status get_int(const Ctx& c, const json& v, const std::string& where, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return c.bad(where, "integer too large");
    *out = static_cast<int64_t>(u);
    return Status::ok();
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return Status::ok();
  }
  return c.bad(where, "must be an integer");
}

Status get_dtype(const Ctx& c, const json& obj, const std::string& where, DType* out) {
  std::string name;
  VLAC_RETURN_IF_ERROR(get_string(c, obj, "dtype", where, &name));
  auto dt = dtype_from_name(name);
  if (!dt) return c.bad(where, "unknown dtype \"" + printable_name(name) + "\"");
  *out = *dt;
  return Status::ok();
}

Status get_shape(const Ctx& c, const json& obj, const std::string& where, std::vector<int64_t>* out) {
  auto it = obj.find("shape");
  if (it == obj.end()) return c.bad(where, "missing key \"shape\"");
  if (!it->is_array()) return c.bad(where, "\"shape\" must be an array of integers");
  if (it->size() > 16) return c.bad(where, "\"shape\" has more than 16 dimensions");
  out->clear();
  for (const auto& d : *it) {
    int64_t v = 0;
    VLAC_RETURN_IF_ERROR(get_int(c, d, where + ": shape", &v));
    if (v < 0) return c.bad(where, "negative dimension " + std::to_string(v));
    out->push_back(v);
  }
  return Status::ok();
}

/// numel x dtype size; false on overflow.
bool shape_bytes(const std::vector<int64_t>& shape, DType dt, uint64_t* out) {
  uint64_t n = dtype_size(dt);
  for (int64_t d : shape)
    if (mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *out = n;
  return true;
}

Status get_tensors(const Ctx& c, const json& obj, const char* key, const std::string& where,
                   std::vector<PackageTensor>* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return c.bad(where, std::string("missing key \"") + key + "\"");
  if (!it->is_array()) return c.bad(where, std::string("\"") + key + "\" must be an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    std::string w = where + ": " + key + "[" + std::to_string(i) + "]";
    if (!t.is_object()) return c.bad(w, "must be an object");
    PackageTensor pt;
    VLAC_RETURN_IF_ERROR(get_string(c, t, "name", w, &pt.name));
    VLAC_RETURN_IF_ERROR(get_dtype(c, t, w, &pt.dtype));
    VLAC_RETURN_IF_ERROR(get_shape(c, t, w, &pt.shape));
    uint64_t b = 0;
    if (!shape_bytes(pt.shape, pt.dtype, &b)) return c.bad(w, "shape x dtype size overflows");
    if (!seen.insert(pt.name).second) return c.bad(w, "duplicate name \"" + printable_name(pt.name) + "\"");
    out->push_back(std::move(pt));
  }
  return Status::ok();
}

Status check_segment_ref(const Ctx& c, const std::string& where, const std::string& seg, SegmentKind want,
                         const SegmentKindLookup& lookup) {
  auto kind = lookup(seg);
  if (!kind) return c.bad(where, "segment '" + printable_name(seg) + "' is not in the package");
  if (*kind != want)
    return c.bad(where, "segment '" + printable_name(seg) + "' is of kind " + package::kind_name(*kind) +
                            ", expected " + package::kind_name(want));
  return Status::ok();
}

/// "normalization" / "tokenizer": null or an object with a "segment" of the given kind.
Status get_optional_ref(const Ctx& c, const json& j, const char* key, SegmentKind want,
                        const SegmentKindLookup& lookup, std::optional<std::string>* seg, json* whole) {
  auto it = j.find(key);
  if (it == j.end()) return c.bad(key, "missing key (use null when absent)");
  if (it->is_null()) return Status::ok();
  if (!it->is_object()) return c.bad(key, "must be null or an object");
  std::string s;
  VLAC_RETURN_IF_ERROR(get_string(c, *it, "segment", key, &s));
  VLAC_RETURN_IF_ERROR(check_segment_ref(c, key, s, want, lookup));
  *seg = s;
  *whole = *it;
  return Status::ok();
}

json tensor_json(const PackageTensor& t) {
  return json{{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}};
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

json PackageManifest::to_json() const {
  json j = json::object();
  json es = json::array();
  for (const auto& e : engines) {
    json o = e.extra.is_object() ? e.extra : json::object();
    o["name"] = e.name;
    o["segment"] = e.segment;
    o["backend"] = e.backend;
    json in = json::array(), out = json::array();
    for (const auto& t : e.inputs) in.push_back(tensor_json(t));
    for (const auto& t : e.outputs) out.push_back(tensor_json(t));
    o["inputs"] = std::move(in);
    o["outputs"] = std::move(out);
    es.push_back(std::move(o));
  }
  j["engines"] = std::move(es);
  json cs = json::array();
  for (const auto& v : crossing) {
    cs.push_back(json{{"name", v.name},
                      {"dtype", dtype_name(v.dtype)},
                      {"shape", v.shape},
                      {"bytes", v.bytes},
                      {"producer", v.producer},
                      {"consumers", v.consumers}});
  }
  j["crossing"] = std::move(cs);
  j["policy"] = policy;
  j["metadata"] = metadata;
  auto ref = [](const std::optional<std::string>& seg, const json& whole) -> json {
    if (!seg) return nullptr;
    json o = whole.is_object() ? whole : json::object();
    o["segment"] = *seg;
    return o;
  };
  j["normalization"] = ref(normalization_segment, normalization);
  j["tokenizer"] = ref(tokenizer_segment, tokenizer);
  return j;
}

Result<json> parse_manifest_json(const uint8_t* data, size_t size, const std::string& path) {
  const std::string where = path + ": manifest: ";
  if (size == 0) return invalid_format(where + "empty");
  if (const void* nul = std::memchr(data, 0, size))
    return invalid_format(where + "NUL byte at manifest offset " +
                          std::to_string(static_cast<const uint8_t*>(nul) - data));
  // nlohmann keeps the last of duplicate keys silently; track keys per open object.
  std::vector<std::unordered_set<std::string>> keys;
  std::string problem;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        [[fallthrough]];
      case json::parse_event_t::array_start:
        if (depth >= package::kMaxManifestDepth && problem.empty())
          problem = "nested deeper than " + std::to_string(package::kMaxManifestDepth) + " levels";
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() && !keys.back().insert(parsed.get_ref<const std::string&>()).second &&
            problem.empty())
          problem = "duplicate key \"" + printable_name(parsed.get_ref<const std::string&>()) + "\"";
        break;
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(data, data + size, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& ex) {
    return invalid_format(where + "not valid JSON: " + strip_json_prefix(ex.what()));
  }
  if (!problem.empty()) return invalid_format(where + problem);
  if (!j.is_object()) return invalid_format(where + "must be a JSON object");
  return j;
}

Result<PackageManifest> decode_manifest(const json& j, const std::string& path, const SegmentKindLookup& lookup) {
  Ctx c(path);
  if (!j.is_object()) return c.bad("top level", "must be a JSON object");
  PackageManifest m;

  auto eng = j.find("engines");
  if (eng == j.end()) return c.bad("top level", "missing key \"engines\"");
  if (!eng->is_array()) return c.bad("engines", "must be an array");
  std::unordered_set<std::string> engine_names;
  for (size_t i = 0; i < eng->size(); ++i) {
    const json& e = (*eng)[i];
    std::string w = "engines[" + std::to_string(i) + "]";
    if (!e.is_object()) return c.bad(w, "must be an object");
    PackageEngine pe;
    VLAC_RETURN_IF_ERROR(get_string(c, e, "name", w, &pe.name));
    w += " '" + printable_name(pe.name) + "'";
    if (!engine_names.insert(pe.name).second) return c.bad(w, "duplicate engine name");
    VLAC_RETURN_IF_ERROR(get_string(c, e, "segment", w, &pe.segment));
    VLAC_RETURN_IF_ERROR(check_segment_ref(c, w, pe.segment, SegmentKind::Engine, lookup));
    VLAC_RETURN_IF_ERROR(get_string(c, e, "backend", w, &pe.backend));
    VLAC_RETURN_IF_ERROR(get_tensors(c, e, "inputs", w, &pe.inputs));
    VLAC_RETURN_IF_ERROR(get_tensors(c, e, "outputs", w, &pe.outputs));
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string& k = it.key();
      if (k != "name" && k != "segment" && k != "backend" && k != "inputs" && k != "outputs") pe.extra[k] = it.value();
    }
    m.engines.push_back(std::move(pe));
  }

  auto cr = j.find("crossing");
  if (cr == j.end()) return c.bad("top level", "missing key \"crossing\"");
  if (!cr->is_array()) return c.bad("crossing", "must be an array");
  for (size_t i = 0; i < cr->size(); ++i) {
    const json& v = (*cr)[i];
    std::string w = "crossing[" + std::to_string(i) + "]";
    if (!v.is_object()) return c.bad(w, "must be an object");
    PackageCrossing pc;
    VLAC_RETURN_IF_ERROR(get_string(c, v, "name", w, &pc.name));
    w += " '" + printable_name(pc.name) + "'";
    VLAC_RETURN_IF_ERROR(get_dtype(c, v, w, &pc.dtype));
    VLAC_RETURN_IF_ERROR(get_shape(c, v, w, &pc.shape));
    auto b = v.find("bytes");
    if (b == v.end()) return c.bad(w, "missing key \"bytes\"");
    int64_t bytes = 0;
    VLAC_RETURN_IF_ERROR(get_int(c, *b, w + ": bytes", &bytes));
    uint64_t want = 0;
    if (!shape_bytes(pc.shape, pc.dtype, &want)) return c.bad(w, "shape x dtype size overflows");
    if (bytes < 0 || static_cast<uint64_t>(bytes) != want)
      return c.bad(w, "bytes " + std::to_string(bytes) + " != shape x dtype size " + std::to_string(want));
    pc.bytes = want;
    VLAC_RETURN_IF_ERROR(get_string(c, v, "producer", w, &pc.producer));
    if (!engine_names.count(pc.producer))
      return c.bad(w, "producer '" + printable_name(pc.producer) + "' is not an engine");
    auto cons = v.find("consumers");
    if (cons == v.end() || !cons->is_array()) return c.bad(w, "\"consumers\" must be an array of engine names");
    for (const auto& n : *cons) {
      if (!n.is_string()) return c.bad(w, "\"consumers\" must be an array of engine names");
      const std::string& s = n.get_ref<const std::string&>();
      if (!engine_names.count(s)) return c.bad(w, "consumer '" + printable_name(s) + "' is not an engine");
      pc.consumers.push_back(s);
    }
    m.crossing.push_back(std::move(pc));
  }

  auto pol = j.find("policy");
  if (pol == j.end()) return c.bad("top level", "missing key \"policy\"");
  if (!pol->is_object()) return c.bad("policy", "must be an object");
  m.policy = *pol;
  auto meta = j.find("metadata");
  if (meta == j.end()) return c.bad("top level", "missing key \"metadata\"");
  if (!meta->is_object()) return c.bad("metadata", "must be an object");
  m.metadata = *meta;
  VLAC_RETURN_IF_ERROR(get_optional_ref(c, j, "normalization", SegmentKind::Stats, lookup, &m.normalization_segment,
                                        &m.normalization));
  VLAC_RETURN_IF_ERROR(
      get_optional_ref(c, j, "tokenizer", SegmentKind::Tokenizer, lookup, &m.tokenizer_segment, &m.tokenizer));
  return m;
}

}  // namespace vlac
