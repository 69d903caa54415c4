// `vlac inspect OUT.vlac`: engines (manifest run order), segments, crossing values, totals;
// --verify checks every segment checksum (bounded memory). Reads through package/ only;
// never writes anything.
#include "inspect_package.h"

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "package/package.h"

namespace vlac::cli {

namespace {

using json = nlohmann::json;
using package::hex64;
using package::kind_name;
using package::printable_name;  // manifest strings are untrusted text

void table(std::string* out, const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t i = 0; i < r.size(); ++i) {
      std::string pad(w[i] - r[i].size(), ' ');
      bool ra = i < right.size() && right[i];
      line += " " + (ra ? pad + r[i] : (i + 1 == r.size() ? r[i] : r[i] + pad));
    }
    *out += line + "\n";
  }
}

std::string tensors_text(const std::vector<PackageTensor>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i)
    s += (i ? ", " : "") + printable_name(ts[i].name) + " " + dtype_name(ts[i].dtype) + shape_string(ts[i].shape);
  return s.empty() ? "-" : s;
}

json tensors_json(const std::vector<PackageTensor>& ts) {
  json a = json::array();
  for (const auto& t : ts) a.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
  return a;
}

struct Totals {
  uint64_t engine_bytes = 0, other_bytes = 0, padding_bytes = 0, crossing_bytes = 0;
};

Totals totals_of(const Package& p) {
  Totals t;
  uint64_t used = p.layout().manifest_end;
  for (const auto& s : p.segments()) {
    (s.kind == package::SegmentKind::Engine ? t.engine_bytes : t.other_bytes) += s.size;
    used += s.size;
  }
  t.padding_bytes = p.file_size() - used;
  for (const auto& c : p.manifest().crossing) t.crossing_bytes += c.bytes;
  return t;
}

std::string text_of(const Package& p, const Status* verified) {
  const PackageManifest& m = p.manifest();
  std::string out = "package: " + p.path() + " (vlac package format " + std::to_string(p.version()) + ", " +
                    format_bytes(p.file_size()) + ", " + std::to_string(p.segments().size()) + " segments)\n";
  out += "\nengines (run order): " + std::to_string(m.engines.size()) + "\n";
  if (!m.engines.empty()) {
    std::vector<std::vector<std::string>> rows = {{"#", "name", "backend", "segment", "size", "inputs", "outputs"}};
    for (size_t i = 0; i < m.engines.size(); ++i) {
      const auto& e = m.engines[i];
      const PackageSegment* s = p.find(e.segment);
      rows.push_back({std::to_string(i), printable_name(e.name), printable_name(e.backend), printable_name(e.segment), s ? format_bytes(s->size) : "?",
                      tensors_text(e.inputs), tensors_text(e.outputs)});
    }
    table(&out, rows, {true, false, false, false, true, false, false});
  }
  out += "\nsegments: " + std::to_string(p.segments().size()) + "\n";
  if (!p.segments().empty()) {
    std::vector<std::vector<std::string>> rows = {{"name", "kind", "offset", "size", "checksum (xxh64)"}};
    for (const auto& s : p.segments())
      rows.push_back({s.name, kind_name(s.kind), std::to_string(s.offset), format_bytes(s.size), hex64(s.checksum)});
    table(&out, rows, {false, false, true, true, false});
  }
  out += "\ncrossing values: " + std::to_string(m.crossing.size()) + "\n";
  if (!m.crossing.empty()) {
    std::vector<std::vector<std::string>> rows = {{"name", "dtype", "shape", "size", "producer -> consumers"}};
    for (const auto& c : m.crossing) {
      std::string cons;
      for (size_t i = 0; i < c.consumers.size(); ++i) cons += (i ? ", " : "") + printable_name(c.consumers[i]);
      rows.push_back({printable_name(c.name), dtype_name(c.dtype), shape_string(c.shape), format_bytes(c.bytes),
                      printable_name(c.producer) + " -> " + cons});
    }
    table(&out, rows, {false, false, false, true, false});
  }
  out += "\nnormalization: " + (m.normalization_segment ? "segment '" + *m.normalization_segment + "'" : "none") + "\n";
  out += "tokenizer: " + (m.tokenizer_segment ? "segment '" + *m.tokenizer_segment + "'" : "none") + "\n";
  auto type = m.policy.find("type");
  auto precision = m.policy.find("precision");
  out += "policy: " + (type != m.policy.end() && type->is_string() ? printable_name(type->get<std::string>()) : std::string("-")) +
         (precision != m.policy.end() && precision->is_string()
              ? ", precision " + printable_name(precision->get<std::string>())
              : std::string()) +
         " (" + std::to_string(m.policy.size()) + " config keys)\n";
  // vlac compile --calibrate records how the 8-bit codes were chosen.
  if (auto c = m.metadata.find("calibration"); c != m.metadata.end() && c->is_object()) {
    const auto num = [&](const char* k) {
      auto v = c->find(k);
      if (v == c->end() || !v->is_number()) return std::string("-");
      if (!v->is_number_float()) return v->dump();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v->get<double>());
      return std::string(buf);
    };
    auto obs = c->find("observations");
    const size_t n = obs != c->end() && obs->is_array() ? obs->size() : 0;
    auto method = c->find("method");
    auto act = c->find("act_order");
    out += "calibration: " + (method != c->end() && method->is_string() ? printable_name(method->get<std::string>()) : std::string("-")) +
           " on " + std::to_string(n) + " observation" + (n == 1 ? "" : "s") + ", damp " + num("damp") + ", block " +
           num("block") + ", " + (act != c->end() && act->is_boolean() && act->get<bool>() ? "act order" : "index order") +
           ", " + num("tensors") + " tensors\n";
  }
  Totals t = totals_of(p);
  out += "\ntotal: " + format_bytes(p.file_size()) + " (" + std::to_string(p.file_size()) + " bytes): engines " +
         format_bytes(t.engine_bytes) + ", other segments " + format_bytes(t.other_bytes) + ", header+manifest " +
         format_bytes(p.layout().manifest_end) + ", alignment padding " + format_bytes(t.padding_bytes) +
         "; crossing values " + format_bytes(t.crossing_bytes) + "\n";
  if (verified != nullptr)
    out += verified->is_ok() ? "verify: all " + std::to_string(p.segments().size()) + " segment checksums match\n"
                             : "verify: FAILED: " + verified->message() + "\n";
  return out;
}

json json_of(const Package& p, const Status* verified) {
  json j;
  j["path"] = p.path();
  j["format_version"] = p.version();
  j["file_size"] = p.file_size();
  json segs = json::array();
  for (const auto& s : p.segments())
    segs.push_back({{"name", s.name}, {"kind", kind_name(s.kind)}, {"offset", s.offset}, {"size", s.size},
                    {"alignment", s.alignment}, {"checksum", hex64(s.checksum)}});
  j["segments"] = std::move(segs);
  json es = json::array();
  for (const auto& e : p.manifest().engines) {
    const PackageSegment* s = p.find(e.segment);
    es.push_back({{"name", e.name}, {"backend", e.backend}, {"segment", e.segment},
                  {"size", s ? s->size : 0}, {"inputs", tensors_json(e.inputs)}, {"outputs", tensors_json(e.outputs)}});
  }
  j["engines"] = std::move(es);
  j["crossing"] = p.manifest_json()["crossing"];
  j["normalization"] = p.manifest_json()["normalization"];
  j["tokenizer"] = p.manifest_json()["tokenizer"];
  j["policy"] = p.manifest().policy;
  j["metadata"] = p.manifest().metadata;
  Totals t = totals_of(p);
  j["totals"] = {{"segments", p.segments().size()},   {"engine_bytes", t.engine_bytes},
                 {"other_bytes", t.other_bytes},       {"header_manifest_bytes", p.layout().manifest_end},
                 {"padding_bytes", t.padding_bytes},   {"crossing_bytes", t.crossing_bytes}};
  if (verified == nullptr) {
    j["verified"] = nullptr;
  } else {
    j["verified"] = verified->is_ok();
    if (!verified->is_ok()) j["verify_error"] = verified->message();
  }
  return j;
}

}  // namespace

Status inspect_package(const std::string& path, bool verify, bool as_json, MemMeter& meter) {
  meter.begin_phase("open");
  VLAC_ASSIGN_OR_RETURN(Package p, Package::open(path));
  Status verified;
  if (verify) {
    meter.begin_phase("verify");
    verified = p.verify();
  }
  meter.begin_phase("report");
  meter.add_extra("package_bytes", std::to_string(p.file_size()));
  meter.add_extra("segments", std::to_string(p.segments().size()));
  std::string text = as_json ? json_of(p, verify ? &verified : nullptr).dump(2, ' ', false, json::error_handler_t::replace) + "\n"
                             : text_of(p, verify ? &verified : nullptr);
  meter.end_phase();
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    return io_error("cannot write to standard output");
  return verified;
}

}  // namespace vlac::cli
