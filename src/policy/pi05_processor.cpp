// Parsing of lerobot's processor JSON + stats files, and the pure pre/post-processing steps.
// float32 arithmetic in lerobot's operation order; no fused multiply-add (bins must not flip).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "policy/pi05_processor.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/dtype.h"
#include "io/json_reader.h"
#include "io/safetensors.h"

namespace vlac {

namespace {

using nlohmann::json;

// Stats and JSON side files are small; anything larger is not a processor file.
constexpr uint64_t kMaxSideFileBytes = 256ull << 20;

Result<NormMode> parse_mode(const std::string& s, const std::string& where) {
  if (s == "IDENTITY") return NormMode::Identity;
  if (s == "MEAN_STD") return NormMode::MeanStd;
  if (s == "MIN_MAX") return NormMode::MinMax;
  if (s == "QUANTILES") return NormMode::Quantiles;
  if (s == "QUANTILE10") return NormMode::Quantile10;
  return unsupported(where + ": normalization mode '" + printable(s) +
                     "' is not one of IDENTITY, MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10");
}

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

// Reads a whole small file; NotFound if absent.
Result<std::vector<uint8_t>> read_small_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return not_found(path + ": no such file");
  if (uint64_t(st.st_size) > kMaxSideFileBytes) return invalid_format(path + ": larger than 256 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open");
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error(path + ": read failed");
  return b;
}

bool file_exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Values of a stats tensor as float32 (lerobot loads every stat with .to(float32)).
bool to_f32(const TensorInfo& t, const uint8_t* p, std::vector<float>* out) {
  const uint64_t n = t.numel();
  out->resize(size_t(n));
  for (uint64_t i = 0; i < n; ++i) {
    float v;
    switch (t.dtype) {
      case DType::F32: std::memcpy(&v, p + 4 * i, 4); break;
      case DType::F64: { double d; std::memcpy(&d, p + 8 * i, 8); v = float(d); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); v = f16_to_f32(h); break; }
      case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); v = bf16_to_f32(h); break; }
      case DType::I64: { int64_t x; std::memcpy(&x, p + 8 * i, 8); v = float(x); break; }
      case DType::I32: { int32_t x; std::memcpy(&x, p + 4 * i, 4); v = float(x); break; }
      default: return false;
    }
    (*out)[size_t(i)] = v;
  }
  return true;
}

struct StepCtx {
  std::string where;  // "<origin>/<json> step <i> (<registry_name>)"
};

Status get_bool(const json& cfg, const char* key, bool* out, const StepCtx& s) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return invalid_format(s.where + ": '" + key + "' must be true or false");
  *out = it->get<bool>();
  return Status::ok();
}

Status get_string(const json& cfg, const char* key, std::string* out, const StepCtx& s) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return Status::ok();
  if (!it->is_string()) return invalid_format(s.where + ": '" + key + "' must be a string");
  *out = it->get<std::string>();
  return Status::ok();
}

Result<std::optional<std::vector<std::string>>> get_string_list(const json& cfg, const char* key, const StepCtx& s) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<std::vector<std::string>>();
  if (!it->is_array()) return invalid_format(s.where + ": '" + key + "' must be a list of strings");
  std::vector<std::string> v;
  for (const auto& e : *it) {
    if (e.is_null()) { v.emplace_back(); continue; }  // lerobot filters falsy names
    if (!e.is_string()) return invalid_format(s.where + ": '" + key + "' must be a list of strings");
    v.push_back(e.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(v));
}

Status device_step(const json& cfg, const StepCtx& s) {
  std::string fd;
  VLAC_RETURN_IF_ERROR(get_string(cfg, "float_dtype", &fd, s));
  if (!fd.empty() && fd != "float32" && fd != "float")
    return unsupported(s.where + ": float_dtype '" + printable(fd) + "' (vlac runs observations in float32)");
  return Status::ok();
}

Result<Pi05Normalizer> normalizer_step(const json& step, const json& cfg, const ProcessorFiles& in,
                                       const StepCtx& s) {
  Pi05Normalizer n;
  n.origin = s.where;
  if (auto it = cfg.find("eps"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() >= 0)) return invalid_format(s.where + ": 'eps' must be a number >= 0");
    n.eps = float(it->get<double>());
  }
  if (auto it = cfg.find("features"); it != cfg.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_format(s.where + ": 'features' must be an object");
    for (const auto& [key, f] : it->items()) {
      if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
        return invalid_format(s.where + ": feature '" + printable(key) + "' needs a string 'type'");
      Pi05Normalizer::Feature feat;
      feat.type = f["type"].get<std::string>();
      if (auto sh = f.find("shape"); sh != f.end() && !sh->is_null()) {
        if (!sh->is_array()) return invalid_format(s.where + ": feature '" + printable(key) + "' shape must be a list");
        for (const auto& d : *sh) {
          if (!d.is_number_integer() || d.get<int64_t>() < 0)
            return invalid_format(s.where + ": feature '" + printable(key) + "' shape must hold integers >= 0");
          feat.shape.push_back(d.get<int64_t>());
        }
      }
      n.features[key] = std::move(feat);
    }
  }
  if (auto it = cfg.find("norm_map"); it != cfg.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_format(s.where + ": 'norm_map' must be an object");
    for (const auto& [type, mode] : it->items()) {
      if (!mode.is_string()) return invalid_format(s.where + ": norm_map '" + printable(type) + "' must be a string");
      VLAC_ASSIGN_OR_RETURN(n.norm_map[type], parse_mode(mode.get<std::string>(), s.where));
    }
  }
  VLAC_ASSIGN_OR_RETURN(n.normalize_observation_keys, get_string_list(cfg, "normalize_observation_keys", s));
  // The stats: the file the step names (its index differs across lerobot versions).
  if (auto it = step.find("state_file"); it != step.end() && !it->is_null()) {
    if (!it->is_string()) return invalid_format(s.where + ": 'state_file' must be a string");
    const std::string name = it->get<std::string>();
    auto f = in.files.find(name);
    if (f == in.files.end())
      return not_found(in.origin + "/" + name + ": stats file named by " + s.where + " is missing");
    const std::string path = in.origin + "/" + name;
    VLAC_ASSIGN_OR_RETURN(SafetensorsHeader h, parse_safetensors_header(f->second.data(), f->second.size(), path));
    for (const TensorInfo& t : h.tensors) {
      const size_t dot = t.name.rfind('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == t.name.size())
        return invalid_format(path + ": stats key '" + printable(t.name) + "' is not '<feature>.<stat>'");
      std::vector<float> v;
      if (!to_f32(t, f->second.data() + h.data_offset + t.data_begin, &v)) continue;  // e.g. BOOL: unused
      n.stats[t.name.substr(0, dot)][t.name.substr(dot + 1)] = std::move(v);
    }
  }
  return n;
}

Status parse_preprocessor(const json& root, const ProcessorFiles& in, const std::string& where, Pi05Processor* p) {
  p->has_preprocessor = true;
  const auto steps = root.find("steps");
  if (steps == root.end() || !steps->is_array()) return invalid_format(where + ": no 'steps' list");
  for (size_t i = 0; i < steps->size(); ++i) {
    const json& step = (*steps)[i];
    if (!step.is_object()) return invalid_format(where + ": step " + std::to_string(i) + " is not an object");
    if (!step.contains("registry_name") || !step["registry_name"].is_string()) {
      std::string cls = step.contains("class") && step["class"].is_string() ? step["class"].get<std::string>() : "?";
      return unsupported(where + ": step " + std::to_string(i) + " (class '" + printable(cls) +
                         "') is not a registered lerobot step vlac knows");
    }
    const std::string name = step["registry_name"].get<std::string>();
    StepCtx s{where + " step " + std::to_string(i) + " (" + printable(name) + ")"};
    static const json kEmpty = json::object();
    const json& cfg = step.contains("config") && step["config"].is_object() ? step["config"] : kEmpty;
    if (name == "rename_observations_processor") {
      if (auto it = cfg.find("rename_map"); it != cfg.end() && !it->is_null()) {
        if (!it->is_object()) return invalid_format(s.where + ": 'rename_map' must be an object");
        for (const auto& [from, to] : it->items()) {
          if (!to.is_string()) return invalid_format(s.where + ": 'rename_map' values must be strings");
          p->rename_map[from] = to.get<std::string>();
        }
      }
    } else if (name == "to_batch_processor") {
      // vlac handles one observation; a leading batch dim of 1 is accepted where tensors are read.
    } else if (name == "relative_actions_processor") {
      p->relative_step = true;
      VLAC_RETURN_IF_ERROR(get_bool(cfg, "enabled", &p->relative_enabled, s));
      VLAC_ASSIGN_OR_RETURN(auto ex, get_string_list(cfg, "exclude_joints", s));
      p->exclude_joints = ex.value_or(std::vector<std::string>{});
      VLAC_ASSIGN_OR_RETURN(p->action_names, get_string_list(cfg, "action_names", s));
    } else if (name == "normalizer_processor") {
      VLAC_ASSIGN_OR_RETURN(Pi05Normalizer n, normalizer_step(step, cfg, in, s));
      p->normalizer = std::move(n);
    } else if (name == "pi05_prepare_state_tokenizer_processor_step") {
      p->state_prompt = true;
      VLAC_RETURN_IF_ERROR(get_string(cfg, "task_key", &p->state_prompt_task_key, s));
    } else if (name == "tokenizer_processor") {
      Pi05TokenizerStep t;
      VLAC_RETURN_IF_ERROR(get_string(cfg, "task_key", &t.task_key, s));
      VLAC_RETURN_IF_ERROR(get_string(cfg, "tokenizer_name", &t.tokenizer_name, s));
      if (auto it = cfg.find("max_length"); it != cfg.end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 20))
          return invalid_format(s.where + ": 'max_length' must be an integer in [1, 1048576]");
        t.options.max_length = it->get<int64_t>();
      } else {
        t.options.max_length = 512;  // lerobot's default
      }
      VLAC_RETURN_IF_ERROR(get_bool(cfg, "truncation", &t.options.truncation, s));
      std::string side = "right", padding = "max_length";
      VLAC_RETURN_IF_ERROR(get_string(cfg, "padding_side", &side, s));
      VLAC_RETURN_IF_ERROR(get_string(cfg, "padding", &padding, s));
      if (side != "right" && side != "left")
        return invalid_format(s.where + ": 'padding_side' must be \"right\" or \"left\"");
      t.options.pad_left = side == "left";
      if (padding == "max_length") t.options.pad_to_max = true;
      else if (padding == "longest" || padding == "do_not_pad") t.options.pad_to_max = false;
      else return unsupported(s.where + ": padding '" + printable(padding) + "'");
      p->tokenizer_step = t;
    } else if (name == "device_processor") {
      VLAC_RETURN_IF_ERROR(device_step(cfg, s));
    } else {
      return unsupported(s.where + ": vlac does not implement this processor step");
    }
  }
  return Status::ok();
}

Status parse_postprocessor(const json& root, const ProcessorFiles& in, const std::string& where, Pi05Processor* p) {
  p->has_postprocessor = true;
  const auto steps = root.find("steps");
  if (steps == root.end() || !steps->is_array()) return invalid_format(where + ": no 'steps' list");
  for (size_t i = 0; i < steps->size(); ++i) {
    const json& step = (*steps)[i];
    if (!step.is_object() || !step.contains("registry_name") || !step["registry_name"].is_string())
      return unsupported(where + ": step " + std::to_string(i) + " is not a registered lerobot step vlac knows");
    const std::string name = step["registry_name"].get<std::string>();
    StepCtx s{where + " step " + std::to_string(i) + " (" + printable(name) + ")"};
    static const json kEmpty = json::object();
    const json& cfg = step.contains("config") && step["config"].is_object() ? step["config"] : kEmpty;
    if (name == "unnormalizer_processor") {
      VLAC_ASSIGN_OR_RETURN(Pi05Normalizer n, normalizer_step(step, cfg, in, s));
      p->unnormalizer = std::move(n);
    } else if (name == "absolute_actions_processor") {
      VLAC_RETURN_IF_ERROR(get_bool(cfg, "enabled", &p->absolute_enabled, s));
    } else if (name == "device_processor") {
      VLAC_RETURN_IF_ERROR(device_step(cfg, s));
    } else {
      return unsupported(s.where + ": vlac does not implement this processor step");
    }
  }
  return Status::ok();
}

// Python str.isspace() for one code point.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 code point at s[i] (length in *len); invalid bytes decode as themselves
// with length 1 (never whitespace above 0x7F).
uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto b = [&](size_t k) { return uint8_t(s[k]); };
  const uint8_t c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) { *len = 1; return c < 0x80 ? c : 0xFFFFFFFFu; }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) { *len = 1; return 0xFFFFFFFFu; }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  *len = n;
  return cp;
}

}  // namespace

const char* norm_mode_name(NormMode m) {
  switch (m) {
    case NormMode::Identity: return "IDENTITY";
    case NormMode::MeanStd: return "MEAN_STD";
    case NormMode::MinMax: return "MIN_MAX";
    case NormMode::Quantiles: return "QUANTILES";
    case NormMode::Quantile10: return "QUANTILE10";
  }
  return "?";
}

NormMode Pi05Normalizer::mode_for(const std::string& key, const std::string& type) const {
  auto m = norm_map.find(type);
  if (m == norm_map.end() || m->second == NormMode::Identity || !stats.count(key)) return NormMode::Identity;
  return m->second;
}

Status Pi05Normalizer::apply(const std::string& key, const std::string& type, float* values, size_t n, bool inverse,
                             size_t axis_len, size_t inner) const {
  const NormMode mode = mode_for(key, type);
  if (mode == NormMode::Identity) return Status::ok();
  const auto& st = stats.at(key);
  const char* na = nullptr;
  const char* nb = nullptr;
  switch (mode) {
    case NormMode::MeanStd: na = "mean"; nb = "std"; break;
    case NormMode::MinMax: na = "min"; nb = "max"; break;
    case NormMode::Quantiles: na = "q01"; nb = "q99"; break;
    case NormMode::Quantile10: na = "q10"; nb = "q90"; break;
    case NormMode::Identity: return Status::ok();
  }
  auto ia = st.find(na), ib = st.find(nb);
  if (ia == st.end() || ib == st.end())
    return invalid_format(origin + ": " + norm_mode_name(mode) + " normalization of '" + key + "' needs stats '" +
                          key + "." + na + "' and '" + key + "." + nb + "'");
  const std::vector<float>& a = ia->second;
  const std::vector<float>& b = ib->second;
  if (inner == 0) inner = 1;
  if (axis_len == 0) axis_len = 1;
  if (a.size() != b.size() || a.empty())
    return invalid_format(origin + ": stats '" + key + "." + na + "' and '" + key + "." + nb + "' differ in size");
  const size_t m = a.size();
  if ((m != 1 && m != axis_len) || n % (axis_len * inner) != 0)
    return shape_mismatch(origin + ": stats '" + key + "." + na + "' hold " + std::to_string(m) + " values but '" + key +
                          "' has " + std::to_string(axis_len) + " (the stats belong to another robot?)");
  const float one = 1.0f, two = 2.0f;
  for (size_t i = 0; i < n; ++i) {
    const size_t j = m == 1 ? 0 : (i / inner) % axis_len;
    const float x = values[i];
    float y;
    if (mode == NormMode::MeanStd) {
      const float mean = a[j], std = b[j];
      y = inverse ? x * std + mean : (x - mean) / (std + eps);
    } else {
      float d = b[j] - a[j];
      if (d == 0.0f) d = eps;
      const float lo = a[j];
      if (mode == NormMode::MinMax)
        y = inverse ? (x + one) / two * d + lo : two * (x - lo) / d - one;
      else
        y = inverse ? (x + one) * d / two + lo : two * (x - lo) / d - one;
    }
    values[i] = y;
  }
  return Status::ok();
}

std::vector<bool> Pi05Processor::relative_mask(int64_t action_dim) const {
  const size_t n = size_t(std::max<int64_t>(action_dim, 0));
  std::vector<std::string> tokens;
  for (const auto& e : exclude_joints)
    if (!e.empty()) tokens.push_back(lower_ascii(e));
  if (tokens.empty() || !action_names) return std::vector<bool>(n, true);
  std::vector<bool> mask;
  for (size_t i = 0; i < std::min(n, action_names->size()); ++i) {
    const std::string name = lower_ascii((*action_names)[i]);
    bool excluded = false;
    for (const auto& t : tokens) excluded = excluded || name == t || name.find(t) != std::string::npos;
    mask.push_back(!excluded);
  }
  mask.resize(n, true);
  return mask;
}

Result<Pi05Processor> parse_pi05_processor(const ProcessorFiles& in) {
  Pi05Processor p;
  p.origin = in.origin;
  try {
    if (auto f = in.files.find(kPi05PreprocessorJson); f != in.files.end()) {
      const std::string where = in.origin + "/" + kPi05PreprocessorJson;
      VLAC_ASSIGN_OR_RETURN(json root, parse_json_strict(f->second.data(), f->second.size(), where));
      if (!root.is_object()) return invalid_format(where + ": not a JSON object");
      VLAC_RETURN_IF_ERROR(parse_preprocessor(root, in, where, &p));
    }
    if (auto f = in.files.find(kPi05PostprocessorJson); f != in.files.end()) {
      const std::string where = in.origin + "/" + kPi05PostprocessorJson;
      VLAC_ASSIGN_OR_RETURN(json root, parse_json_strict(f->second.data(), f->second.size(), where));
      if (!root.is_object()) return invalid_format(where + ": not a JSON object");
      VLAC_RETURN_IF_ERROR(parse_postprocessor(root, in, where, &p));
    }
  } catch (const std::exception& e) {  // nlohmann type errors we did not guard: still bad input
    return invalid_format(in.origin + ": processor JSON: " + json_error_text(e));
  }
  if (p.absolute_enabled && !p.relative_step)
    return invalid_format(in.origin + "/" + kPi05PostprocessorJson +
                          ": absolute_actions_processor is enabled but policy_preprocessor.json has no "
                          "relative_actions_processor step to take the state from");
  if (auto f = in.files.find(kPi05TokenizerModel); f != in.files.end()) {
    VLAC_ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::from_bytes(f->second, in.origin + "/" + kPi05TokenizerModel));
    p.set_tokenizer(std::move(t));
  }
  return p;
}

std::vector<std::string> pi05_processor_file_names(const std::string& policy_dir) {
  std::vector<std::string> names;
  for (const char* js : {kPi05PreprocessorJson, kPi05PostprocessorJson}) {
    const std::string path = policy_dir + "/" + js;
    if (!file_exists(path)) continue;
    names.push_back(js);
    // The stats files the steps name (a broken JSON lists only itself; parsing reports it).
    auto j = read_json_file(path, kMaxSideFileBytes);
    if (!j.is_ok() || !j->is_object()) continue;
    auto steps = j->find("steps");
    if (steps == j->end() || !steps->is_array()) continue;
    for (const auto& s : *steps) {
      if (!s.is_object()) continue;
      auto sf = s.find("state_file");
      if (sf == s.end() || !sf->is_string()) continue;
      const std::string name = sf->get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") continue;
      if (file_exists(policy_dir + "/" + name) && std::find(names.begin(), names.end(), name) == names.end())
        names.push_back(name);
    }
  }
  if (file_exists(policy_dir + "/" + kPi05TokenizerModel)) names.push_back(kPi05TokenizerModel);
  return names;
}

Result<Pi05Processor> load_pi05_processor(const std::string& policy_dir) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> owned;
  for (const std::string& name : pi05_processor_file_names(policy_dir)) {
    VLAC_ASSIGN_OR_RETURN(std::vector<uint8_t> b, read_small_file(policy_dir + "/" + name));
    owned.emplace_back(name, std::move(b));
  }
  ProcessorFiles in;
  in.origin = policy_dir;
  for (const auto& [name, bytes] : owned) in.files[name] = std::span<const uint8_t>(bytes);
  return parse_pi05_processor(in);
}

std::string pi05_clean_task(std::string_view task) {
  // Code points with their byte ranges; strip whitespace ones at both ends (Python str.strip).
  std::vector<std::pair<size_t, size_t>> cps;  // (offset, length) of each non-space/space run item
  std::vector<bool> space;
  for (size_t i = 0; i < task.size();) {
    size_t len = 1;
    const uint32_t cp = decode_at(task, i, &len);
    cps.emplace_back(i, len);
    space.push_back(py_space(cp));
    i += len;
  }
  size_t b = 0, e = cps.size();
  while (b < e && space[b]) ++b;
  while (e > b && space[e - 1]) --e;
  std::string out = b < e ? std::string(task.substr(cps[b].first, cps[e - 1].first + cps[e - 1].second - cps[b].first))
                          : std::string();
  for (char& c : out)
    if (c == '_' || c == '\n') c = ' ';
  return out;
}

std::vector<int> pi05_discretize_state(const float* normalized, size_t n) {
  std::vector<int> bins(n);
  for (size_t i = 0; i < n; ++i) {
    const double v = normalized[i];
    if (std::isnan(v)) { bins[i] = 255; continue; }  // numpy sorts NaN after every edge
    int count = 0;
    for (int k = 0; k < 256; ++k)
      if (-1.0 + double(k) / 128.0 <= v) ++count;  // edges -1 + 2k/256, exact in binary
    bins[i] = count - 1;
  }
  return bins;
}

std::string pi05_prompt(std::string_view task, const std::vector<int>& bins) {
  std::string s = "Task: " + pi05_clean_task(task) + ", State: ";
  for (size_t i = 0; i < bins.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(bins[i]);
  }
  return s + ";\nAction: ";
}

}  // namespace vlac
