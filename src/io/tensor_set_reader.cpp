// TensorSet: one logical tensor set over a single safetensors file or the shards of a
// model.safetensors.index.json. Checks that the index and the shards agree exactly; maps
// every shard once and reads only headers. Never asserts on file bytes.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "io/json_reader.h"
#include "io/safetensors.h"

namespace vlac {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A shard name from an index must stay inside the index's folder.
Status check_shard_name(const std::string& index, const std::string& tensor, const std::string& f) {
  auto bad = [&](const std::string& why) {
    return invalid_format(index + ": tensor '" + printable(tensor) + "': shard '" + printable(f) + "' " + why);
  };
  if (f.empty()) return bad("is empty");
  if (f.find('\0') != std::string::npos) return bad("contains a NUL byte");
  if (f.front() == '/') return bad("is an absolute path");
  size_t start = 0;
  while (start <= f.size()) {
    size_t end = f.find('/', start);
    if (end == std::string::npos) end = f.size();
    if (f.compare(start, end - start, "..") == 0 && end - start == 2) return bad("leaves the index's folder (..)");
    start = end + 1;
  }
  return Status::ok();
}

Status folder_listing_error(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  fs::directory_iterator it(dir, ec), end;
  while (!ec && it != end) {
    std::string n = it->path().filename().string();
    bool is_dir = it->is_directory(ec);
    names.push_back(printable(n, 80) + (is_dir ? "/" : ""));
    it.increment(ec);
  }
  std::sort(names.begin(), names.end());
  std::string list;
  for (size_t i = 0; i < names.size() && i < 12; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 12) list += ", ... (" + std::to_string(names.size()) + " entries)";
  if (names.empty()) list = "nothing";
  return not_found(dir + ": no " + kSingleName + " or " + kIndexName + " in this folder (it has: " + list + ")");

}

}  // namespace

const TensorSet::Entry* TensorSet::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

uint64_t TensorSet::total_bytes() const {
  uint64_t n = 0;
  for (const Entry& e : entries_) n += e.info->nbytes();
  return n;
}

Result<TensorSet> TensorSet::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found(path + ": no such file or folder");
  if (S_ISDIR(st.st_mode)) {
    std::string index = join_path(path, kIndexName);
    std::string single = join_path(path, kSingleName);
    struct stat s2 {};
    if (::stat(index.c_str(), &s2) == 0) return open(index);
    if (::stat(single.c_str(), &s2) == 0) return open(single);
    return folder_listing_error(path);
  }

  TensorSet set;
  set.source_ = path;
  if (!ends_with(path, ".json")) {
    VLAC_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
    set.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
    const SafetensorsFile* file = set.files_.back().get();
    for (const TensorInfo& t : file->tensors()) {
      set.by_name_.emplace(t.name, set.entries_.size());
      set.entries_.push_back({file, &t});
    }
    set.metadata_ = file->metadata();
    return set;
  }

  // Sharded: the index json.
  VLAC_ASSIGN_OR_RETURN(json index, read_json_file(path, kJsonMaxFileBytes, 16));
  if (!index.is_object()) return invalid_format(path + ": index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return invalid_format(path + ": no 'weight_map' object");
  std::map<std::string, std::string> weight_map;  // tensor -> shard name
  std::set<std::string> shard_names;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      return invalid_format(path + ": tensor '" + printable(it.key()) + "': weight_map value is not a string");
    const std::string& f = it.value().get_ref<const std::string&>();
    VLAC_RETURN_IF_ERROR(check_shard_name(path, it.key(), f));
    weight_map.emplace(it.key(), f);
    shard_names.insert(f);
  }
  if (shard_names.empty()) return invalid_format(path + ": weight_map is empty");

  const std::string dir = parent_dir(path);
  std::map<std::string, std::string> shard_of;  // tensor -> shard it was found in
  for (const std::string& shard : shard_names) {
    std::string shard_path = join_path(dir, shard);
    auto opened = SafetensorsFile::open(shard_path);
    if (!opened.is_ok()) {
      if (opened.status().code() == StatusCode::NotFound)
        return not_found(path + ": shard '" + printable(shard) + "' named in weight_map: no such file (" +
                         printable(shard_path) + ")");
      return opened.status();
    }
    set.files_.push_back(std::make_unique<SafetensorsFile>(std::move(opened).value()));
    const SafetensorsFile* file = set.files_.back().get();
    for (const TensorInfo& t : file->tensors()) {
      auto [prev, fresh] = shard_of.emplace(t.name, shard);
      if (!fresh)
        return invalid_format(path + ": tensor '" + printable(t.name) + "': in two shards, '" +
                              printable(prev->second) + "' and '" + printable(shard) + "'");
      auto w = weight_map.find(t.name);
      if (w == weight_map.end())
        return invalid_format(shard_path + ": tensor '" + printable(t.name) + "': not listed in the weight_map of " +
                              path);
      if (w->second != shard)
        return invalid_format(path + ": tensor '" + printable(t.name) + "': weight_map names shard '" +
                              printable(w->second) + "' but the tensor is in shard '" + printable(shard) + "'");
      set.by_name_.emplace(t.name, set.entries_.size());
      set.entries_.push_back({file, &t});
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!shard_of.count(name))
      return invalid_format(path + ": tensor '" + printable(name) + "': listed in weight_map for shard '" +
                            printable(shard) + "' but not in that shard");
  }

  set.metadata_ = set.files_.front()->metadata();
  auto md = index.find("metadata");
  if (md != index.end() && md->is_object()) {
    for (auto it = md->begin(); it != md->end(); ++it)
      set.metadata_.emplace(it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return set;
}

}  // namespace vlac
