// Calibration statistics on disk (see calibration_file.h).
#include "compile/calibration_file.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/json_reader.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace vlac {

using nlohmann::json;

namespace {

// Floats of the block-diagonal Σ x xᵀ of k inputs in blocks of `block` (InputStats' layout).
uint64_t stats_floats(int64_t k, int64_t block) {
  const uint64_t full = uint64_t(k / block), rest = uint64_t(k % block);
  return full * uint64_t(block) * uint64_t(block) + rest * rest;
}

Status bad(const std::string& path, const std::string& what) {
  return invalid_format(path + ": not a vlac calibration statistics file (--calibrate-save writes them): " + what);
}

int64_t parse_int(const std::string& s, bool* ok) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  *ok = !s.empty() && end && *end == '\0' && errno == 0;
  return int64_t(v);
}

}  // namespace

Status save_calibration(const ir::QuantCalibration& c, const std::string& path,
                        const std::map<std::string, std::string>& info) {
  std::vector<TensorSpec> specs;
  json weights = json::object();
  for (const auto& [name, st] : c.all()) {
    if (st.h.size() != stats_floats(st.k, c.block()))
      return internal_error("calibration statistics of '" + name + "' do not have their k and block's size");
    specs.push_back({name, DType::F32, {int64_t(st.h.size())}});
    weights[name] = json::object({{"k", st.k}, {"rows", st.rows}});
  }
  std::map<std::string, std::string> meta = info;
  meta["format"] = kCalibrationFormat;
  meta["block"] = std::to_string(c.block());
  meta["weights"] = weights.dump();
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, specs, meta));
  for (const auto& [name, st] : c.all()) VLAC_RETURN_IF_ERROR(w.write(st.h.data(), st.h.size() * sizeof(float)));
  return w.finish().with_context("--calibrate-save");
}

Result<CalibrationFile> read_calibration(const std::string& path, double damp, bool act_order, int threads) {
  VLAC_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  const auto& m = f.metadata();
  auto it = m.find("format");
  if (it == m.end() || it->second != kCalibrationFormat)
    return bad(path, it == m.end() ? "no \"format\" entry" : "format '" + printable(it->second) + "'");
  bool ok = false;
  auto b = m.find("block");
  const int64_t block = b == m.end() ? 0 : parse_int(b->second, &ok);
  if (!ok || block < 1) return bad(path, "no block size of at least 1");
  const auto wit = m.find("weights");
  if (wit == m.end()) return bad(path, "no \"weights\" entry");
  auto weights = parse_json_strict(reinterpret_cast<const uint8_t*>(wit->second.data()), wit->second.size(),
                                   path + " (metadata \"weights\")");
  if (!weights.is_ok()) return weights.status();
  if (!weights->is_object()) return bad(path, "\"weights\" is not an object");
  if (weights->size() != f.tensors().size())
    return bad(path, std::to_string(f.tensors().size()) + " tensors but " + std::to_string(weights->size()) +
                         " weights in \"weights\"");
  CalibrationFile out;
  out.calib = std::make_unique<ir::QuantCalibration>(block, damp, act_order, threads);
  for (const auto& [k, v] : m)
    if (k != "format" && k != "block" && k != "weights") out.info[k] = v;
  for (const TensorInfo& t : f.tensors()) {
    const auto w = weights->find(t.name);
    if (w == weights->end() || !w->is_object() || !w->contains("k") || !(*w)["k"].is_number_integer() ||
        !w->contains("rows") || !(*w)["rows"].is_number_unsigned())
      return bad(path, "tensor '" + printable(t.name) + "' has no k and rows in \"weights\"");
    ir::InputStats st;
    st.k = (*w)["k"].get<int64_t>();
    st.block = block;
    st.rows = (*w)["rows"].get<uint64_t>();
    if (st.k < 1 || t.dtype != DType::F32 || t.shape.size() != 1 || uint64_t(t.shape[0]) != stats_floats(st.k, st.block))
      return bad(path, "tensor '" + printable(t.name) + "' is not the F32 statistics of " + std::to_string(st.k) +
                           " inputs in blocks of " + std::to_string(st.block));
    st.h.resize(size_t(t.shape[0]));
    std::memcpy(st.h.data(), f.data(t), t.nbytes());
    f.drop(t);
    out.calib->set(t.name, std::move(st));
  }
  return out;
}

}  // namespace vlac
