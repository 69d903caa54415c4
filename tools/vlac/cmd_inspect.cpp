// `vlac inspect PATH [--json]`: what a checkpoint (safetensors file, sharded index, folder) or a
// lerobot policy folder holds: tensors, totals per prefix and dtype, config.json, side files.
// Reads headers only (never tensor data). Dispatches on what PATH is, so other kinds
// (--graph POLICY_DIR, OUT.vlac packages) plug in as one more case in inspect_path().
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/bytes.h"
#include "io/json_reader.h"
#include "io/safetensors.h"
#include "inspect_package.h"
#include "package/package.h"
#include "inspect_graph.h"

namespace vlac::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct InspectFlags {
  CommonOptions common;
  std::string path;
  bool json = false;
  bool graph = false;  // --graph: the pi0.5 IR graphs (inspect_graph.cpp)
  bool verify = false;  // --verify: packages only (inspect_package.cpp)
};

/// What PATH names. New kinds (a .vlac package, a graph view) get a value and a case below.
enum class InspectKind {
  Checkpoint,    // a .safetensors file, an index json, or a folder with weights but no config.json
  PolicyFolder,  // a folder with config.json (lerobot policy): weights + config + side files
  Package,       // a .vlac package (not readable yet)
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_path(const std::string& dir, const std::string& name) {
  return (!dir.empty() && dir.back() == '/') ? dir + name : dir + "/" + name;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

InspectKind classify(const std::string& path) {
  if (ends_with(path, ".vlac") || (is_file(path) && has_package_magic(path))) return InspectKind::Package;
  if (is_dir(path) && is_file(join_path(path, "config.json"))) return InspectKind::PolicyFolder;
  return InspectKind::Checkpoint;
}

std::string basename_of(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// --- the model: everything both outputs print -------------------------------------------------

struct Totals {
  uint64_t n = 0, bytes = 0;
};

struct SideFile {
  std::string name;  // relative to the folder; folders end in '/'
  std::string path;  // as opened (relative to the current directory or absolute)
  std::string kind;  // config, weights, processor, stats, tokenizer, other
  uint64_t bytes = 0;
  uint64_t n_files = 1;     // for folders: files inside (recursive)
  int64_t n_tensors = -1;   // weight files: tensors in it
};

// Keys of a lerobot config.json worth showing, in this order.
constexpr const char* kConfigKeys[] = {
    "type", "input_features", "output_features", "chunk_size", "n_action_steps", "num_inference_steps",
    "max_state_dim", "max_action_dim", "dtype", "paligemma_variant", "action_expert_variant",
    "image_resolution", "tokenizer_max_length"};

struct Inspection {
  std::string path;
  InspectKind kind = InspectKind::Checkpoint;
  const TensorSet* set = nullptr;
  std::string group_rule;  // how prefixes were formed
  std::map<std::string, Totals> by_prefix, by_dtype;
  Totals total;
  std::vector<SideFile> files;
  json config;  // the declared subset; null if no config.json
};

std::string prefix_of(const std::string& name, int n_components) {
  size_t pos = 0;
  for (int i = 0; i < n_components; ++i) {
    pos = name.find('.', pos);
    if (pos == std::string::npos) return name;
    if (i + 1 < n_components) ++pos;
  }
  return name.substr(0, pos);
}

std::string file_kind(const std::string& name, bool dir, const std::set<std::string>& weight_files) {
  if (weight_files.count(name) || name == "model.safetensors.index.json") return "weights";
  if (name == "config.json") return "config";
  if (name.rfind("tokenizer", 0) == 0 || name == "special_tokens_map.json") return "tokenizer";
  if (!dir && ends_with(name, ".json") && name.find("processor") != std::string::npos) return "processor";
  if (!dir && ends_with(name, ".safetensors")) return "stats";
  return "other";
}

void folder_size(const std::string& dir, SideFile* out) {
  std::error_code ec;
  out->bytes = 0;
  out->n_files = 0;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  for (size_t guard = 0; !ec && it != end && guard < 100000; ++guard) {
    if (it->is_regular_file(ec)) {
      ++out->n_files;
      out->bytes += it->file_size(ec);
    }
    it.increment(ec);
  }
}

Status list_folder(const std::string& dir, const TensorSet& set, std::vector<SideFile>* out) {
  std::set<std::string> weight_files;
  for (const auto& f : set.files()) weight_files.insert(basename_of(f->path()));
  std::map<std::string, int64_t> n_tensors;
  for (const auto& e : set.tensors()) ++n_tensors[basename_of(e.file->path())];
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) return io_error(dir + ": cannot list: " + ec.message());
  while (!ec && it != end) {
    SideFile f;
    std::string name = it->path().filename().string();
    bool d = it->is_directory(ec);
    f.name = d ? name + "/" : name;
    f.path = it->path().string();
    f.kind = file_kind(name, d, weight_files);
    if (d) folder_size(it->path().string(), &f);
    else f.bytes = it->file_size(ec);
    if (n_tensors.count(name)) f.n_tensors = n_tensors[name];
    out->push_back(std::move(f));
    it.increment(ec);
  }
  std::sort(out->begin(), out->end(), [](const SideFile& a, const SideFile& b) { return a.name < b.name; });
  return Status::ok();
}

Result<json> read_config(const std::string& dir) {
  std::string path = join_path(dir, "config.json");
  VLAC_ASSIGN_OR_RETURN(json cfg, read_json_file(path, 16u << 20, 64));
  if (!cfg.is_object()) return invalid_format(path + ": not a JSON object");
  json declared = json::object();
  for (const char* k : kConfigKeys) {
    auto it = cfg.find(k);
    if (it != cfg.end()) declared[k] = *it;
  }
  return declared;
}

Status build(Inspection* in, const TensorSet& set) {
  in->set = &set;
  bool all_model = !set.tensors().empty();
  for (const auto& e : set.tensors()) all_model = all_model && e.info->name.rfind("model.", 0) == 0;
  int depth = all_model ? 2 : 1;
  in->group_rule = all_model ? "first two dotted components" : "first dotted component";
  for (const auto& e : set.tensors()) {
    const TensorInfo& t = *e.info;
    Totals& p = in->by_prefix[prefix_of(t.name, depth)];
    Totals& d = in->by_dtype[dtype_name(t.dtype)];
    p.n++, p.bytes += t.nbytes();
    d.n++, d.bytes += t.nbytes();
    in->total.n++, in->total.bytes += t.nbytes();
  }
  if (in->kind == InspectKind::PolicyFolder) {
    VLAC_RETURN_IF_ERROR(list_folder(in->path, set, &in->files));
    VLAC_ASSIGN_OR_RETURN(in->config, read_config(in->path));
  } else {
    for (const auto& f : set.files()) {
      SideFile s;
      s.name = basename_of(f->path());
      s.path = f->path();
      s.kind = "weights";
      s.bytes = f->file_size();
      s.n_tensors = static_cast<int64_t>(f->tensors().size());
      in->files.push_back(std::move(s));
    }
  }
  return Status::ok();
}

// --- output -----------------------------------------------------------------------------------

json to_json(const Inspection& in) {
  const TensorSet& set = *in.set;
  json j;
  j["path"] = in.path;
  j["kind"] = in.kind == InspectKind::PolicyFolder ? "policy" : "checkpoint";
  j["source"] = set.source();
  j["metadata"] = set.metadata();
  json tensors = json::array();
  for (const auto& e : set.tensors()) {
    const TensorInfo& t = *e.info;
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.nbytes()},
                       {"file", basename_of(e.file->path())},
                       {"offset", e.file->data_offset() + t.data_begin}});
  }
  j["tensors"] = std::move(tensors);
  json by_prefix = json::object(), by_dtype = json::object();
  for (const auto& [k, v] : in.by_prefix) by_prefix[k] = {{"tensors", v.n}, {"bytes", v.bytes}};
  for (const auto& [k, v] : in.by_dtype) by_dtype[k] = {{"tensors", v.n}, {"bytes", v.bytes}};
  j["totals"] = {{"by_prefix", by_prefix}, {"by_dtype", by_dtype}, {"prefix_rule", in.group_rule}};
  j["n_tensors"] = in.total.n;
  j["total_bytes"] = in.total.bytes;
  json files = json::array();
  for (const auto& f : in.files) {
    json o = {{"name", f.name}, {"path", f.path}, {"kind", f.kind}, {"bytes", f.bytes}};
    if (f.name.back() == '/') o["n_files"] = f.n_files;
    if (f.n_tensors >= 0) o["n_tensors"] = f.n_tensors;
    files.push_back(std::move(o));
  }
  j["files"] = std::move(files);
  j["config"] = in.config;
  return j;
}

// Rows of cells printed with each column padded to its widest cell; `right` marks numeric columns.
void print_table(std::string* out, const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right, const std::string& indent = "  ") {
  std::vector<size_t> w(right.size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) {
      std::string pad(w[c] - r[c].size(), ' ');
      bool last = c + 1 == r.size();
      line += right[c] ? pad + r[c] : (last ? r[c] : r[c] + pad);
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    *out += line + "\n";
  }
}

std::string config_value(const json& v) {
  return v.is_string() ? printable(v.get<std::string>()) : v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string to_text(const Inspection& in) {
  const TensorSet& set = *in.set;
  std::string out;
  out += (in.kind == InspectKind::PolicyFolder ? "policy: " : "checkpoint: ") + printable(in.path, 400) + "\n";
  out += "weights: " + printable(set.source(), 400) + " (" + std::to_string(set.files().size()) +
         (set.files().size() == 1 ? " file" : " files") + ", " + std::to_string(in.total.n) + " tensors, " +
         format_bytes(in.total.bytes) + ")\n";
  if (!set.metadata().empty()) {
    out += "metadata:";
    for (const auto& [k, v] : set.metadata()) out += " " + printable(k, 60) + "=" + printable(v, 60);
    out += "\n";
  }
  if (!in.config.is_null()) {
    out += "\nconfig.json declares:\n";
    std::vector<std::vector<std::string>> rows;
    for (const char* key : kConfigKeys) {
      auto found = in.config.find(key);
      if (found == in.config.end()) continue;
      const std::string k = key;
      const json& v = *found;
      if ((k == "input_features" || k == "output_features") && v.is_object()) {
        rows.push_back({k, ""});
        for (const auto& [fk, fv] : v.items()) {
          std::string desc;
          if (fv.is_object()) {
            auto type = fv.find("type"), shape = fv.find("shape");
            if (type != fv.end()) desc += config_value(*type);
            if (shape != fv.end()) desc += (desc.empty() ? "" : " ") + config_value(*shape);
          }
          if (desc.empty()) desc = config_value(fv);
          rows.push_back({"  " + printable(fk, 80), desc});
        }
      } else {
        rows.push_back({k, config_value(v)});
      }
    }
    print_table(&out, rows, {false, false});
  }
  if (!in.files.empty()) {
    out += in.kind == InspectKind::PolicyFolder ? "\nfiles:\n" : "\nweight files:\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& f : in.files) {
      std::string what = f.n_tensors >= 0 ? std::to_string(f.n_tensors) + " tensors"
                         : f.name.back() == '/' ? std::to_string(f.n_files) + " files" : "";
      rows.push_back({printable(in.kind == InspectKind::PolicyFolder ? f.name : f.path, 200), f.kind, format_bytes(f.bytes), what});
    }
    print_table(&out, rows, {false, false, true, false});
  }

  out += "\ntensors:\n";
  std::vector<std::vector<std::string>> rows = {{"NAME", "DTYPE", "SHAPE", "BYTES", "FILE"}};
  for (const auto& e : set.tensors()) {
    const TensorInfo& t = *e.info;
    rows.push_back({printable(t.name, 400), dtype_name(t.dtype), shape_text(t.shape), format_bytes(t.nbytes()),
                    printable(basename_of(e.file->path()), 200)});
  }
  print_table(&out, rows, {false, false, false, true, false});

  auto totals = [&](const std::string& title, const std::map<std::string, Totals>& m) {
    out += "\n" + title + "\n";
    std::vector<std::vector<std::string>> r = {{"", "TENSORS", "BYTES", "SHARE"}};
    r[0][0] = title.find("dtype") != std::string::npos ? "DTYPE" : "PREFIX";
    for (const auto& [k, v] : m) {
      char share[32];
      std::snprintf(share, sizeof share, "%.1f%%",
                    in.total.bytes ? 100.0 * static_cast<double>(v.bytes) / static_cast<double>(in.total.bytes) : 0.0);
      r.push_back({printable(k, 200), std::to_string(v.n), format_bytes(v.bytes), share});
    }
    print_table(&out, r, {false, true, true, true});
  };
  totals("totals by prefix (" + in.group_rule + "):", in.by_prefix);
  totals("totals by dtype:", in.by_dtype);
  out += "\ntotal: " + std::to_string(in.total.n) + " tensors, " + format_bytes(in.total.bytes) + " (" +
         std::to_string(in.total.bytes) + " bytes)\n";
  return out;
}

Status write_stdout(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    return io_error("cannot write to standard output");
  return Status::ok();
}

// --- the kinds --------------------------------------------------------------------------------

Status inspect_checkpoint(const InspectFlags& f, InspectKind kind, MemMeter& meter) {
  meter.begin_phase("open");
  VLAC_ASSIGN_OR_RETURN(TensorSet set, TensorSet::open(f.path));
  meter.begin_phase("report");
  Inspection in;
  in.path = f.path;
  in.kind = kind;
  VLAC_RETURN_IF_ERROR(build(&in, set));
  meter.add_extra("tensors", std::to_string(in.total.n));
  meter.add_extra("tensor_bytes", std::to_string(in.total.bytes));
  std::string text = f.json ? to_json(in).dump(2, ' ', false, json::error_handler_t::replace) + "\n" : to_text(in);
  Status st = write_stdout(text);
  meter.end_phase();
  return st;
}

Status inspect_path(const InspectFlags& f, MemMeter& meter) {
  InspectKind kind = classify(f.path);
  switch (kind) {
    case InspectKind::Package:
      return inspect_package(f.path, f.verify, f.json, meter);
    case InspectKind::Checkpoint:
    case InspectKind::PolicyFolder:
      return inspect_checkpoint(f, kind, meter);
  }
  return internal_error("inspect: unknown kind");
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  auto* sub = app.add_subcommand(
      "inspect", "list the tensors of a safetensors file, sharded checkpoint or policy folder (headers only)");
  sub->add_option("path", flags->path, "a .safetensors file, a model.safetensors.index.json, or a folder")
      ->required();
  sub->add_flag("--json", flags->json, "print one JSON object (exact bytes) instead of tables");
  sub->add_flag("--verify", flags->verify, "packages: check every segment checksum (exit 2 on a mismatch)");
  add_common_options(sub, &flags->common);
  sub->add_flag("--graph", flags->graph, "print the graphs vlac builds from a pi0.5 policy folder (nodes, shapes, weight bytes)");
  sub->callback([flags] {
    run_command("inspect", flags->common, [&](MemMeter& m) {
      return flags->graph ? inspect_graph(flags->path, m) : inspect_path(*flags, m);
    });
  });
}

}  // namespace vlac::cli
