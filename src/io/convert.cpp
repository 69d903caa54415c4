// Streaming checkpoint conversion (see convert.h). The only allocation that scales with
// anything is the per-tensor list of names; tensor bytes pass through one fixed buffer.
#include "io/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/bytes.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace vlac {

namespace fs = std::filesystem;

namespace {

template <typename T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

const float* f8_table(DType dt) {
  // Built once on first use (function-local statics, no static registration).
  static const auto e4m3 = [] {
    auto t = std::make_unique<float[]>(256);
    for (int i = 0; i < 256; ++i) t[i] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  static const auto e5m2 = [] {
    auto t = std::make_unique<float[]>(256);
    for (int i = 0; i < 256; ++i) t[i] = f8e5m2_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return dt == DType::F8_E4M3 ? e4m3.get() : e5m2.get();
}

// Reads element i of a float tensor as an exact float32 (every source but F64 widens exactly).
template <DType From>
inline float read_f32(const uint8_t* src, uint64_t i, const float* lut) {
  if constexpr (From == DType::F32) return load<float>(src + 4 * i);
  if constexpr (From == DType::F16) return f16_to_f32(load<uint16_t>(src + 2 * i));
  if constexpr (From == DType::BF16) return bf16_to_f32(load<uint16_t>(src + 2 * i));
  if constexpr (From == DType::F8_E4M3 || From == DType::F8_E5M2) return lut[src[i]];
  // F64 is handled separately.
  return 0.0f;
}

template <DType From>
void widen_to(DType to, const uint8_t* src, uint8_t* dst, uint64_t n) {
  const float* lut = (From == DType::F8_E4M3 || From == DType::F8_E5M2) ? f8_table(From) : nullptr;
  switch (to) {
    case DType::F32:
      for (uint64_t i = 0; i < n; ++i) store<float>(dst + 4 * i, read_f32<From>(src, i, lut));
      break;
    case DType::BF16:
      for (uint64_t i = 0; i < n; ++i) store<uint16_t>(dst + 2 * i, f32_to_bf16(read_f32<From>(src, i, lut)));
      break;
    case DType::F16:
      for (uint64_t i = 0; i < n; ++i) store<uint16_t>(dst + 2 * i, f32_to_f16(read_f32<From>(src, i, lut)));
      break;
    default:
      break;
  }
}

void from_f64(DType to, const uint8_t* src, uint8_t* dst, uint64_t n) {
  switch (to) {
    case DType::F32:  // one IEEE rounding, nearest even
      for (uint64_t i = 0; i < n; ++i) store<float>(dst + 4 * i, static_cast<float>(load<double>(src + 8 * i)));
      break;
    case DType::BF16:  // round-to-odd f32 then RNE: equal to a single RNE of the double
      for (uint64_t i = 0; i < n; ++i)
        store<uint16_t>(dst + 2 * i, f32_to_bf16(f64_to_f32_round_odd(load<double>(src + 8 * i))));
      break;
    case DType::F16:
      for (uint64_t i = 0; i < n; ++i)
        store<uint16_t>(dst + 2 * i, f32_to_f16(f64_to_f32_round_odd(load<double>(src + 8 * i))));
      break;
    default:
      break;
  }
}

std::string base_name(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir == ".") return name;
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  bool eq = fs::equivalent(a, b, ec);
  return !ec && eq;
}

struct Item {
  const TensorSet::Entry* entry;
  std::string out_name;
  DType out_dtype;
  uint64_t out_bytes;
};

struct Shard {
  size_t begin = 0, end = 0;  // items [begin, end)
  uint64_t data_bytes = 0;
  std::string final_path;
};

// Streams the items of one shard into `path` through `buffer`.
Status write_shard(const std::string& path, const std::vector<Item>& items, size_t begin, size_t end,
                   const std::map<std::string, std::string>& metadata, uint8_t* buffer, uint64_t buffer_bytes,
                   uint64_t total_in, uint64_t* done_in, ConvertStats* stats, const ConvertProgressFn& progress) {
  std::vector<TensorSpec> specs;
  specs.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) specs.push_back({items[i].out_name, items[i].out_dtype, items[i].entry->info->shape});
  VLAC_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(path, std::move(specs), metadata));
  for (size_t i = begin; i < end; ++i) {
    const Item& it = items[i];
    const SafetensorsFile& file = *it.entry->file;
    const TensorInfo& info = *it.entry->info;
    const uint8_t* src = file.data(info);
    const uint64_t n_in = info.nbytes();
    const uint64_t abs = file.data_offset() + info.data_begin;
    file.map().advise_sequential(abs, n_in);
    if (it.out_dtype == info.dtype) {
      // Byte copy straight from the map: no conversion buffer needed.
      for (uint64_t off = 0; off < n_in; off += buffer_bytes) {
        uint64_t len = std::min(buffer_bytes, n_in - off);
        VLAC_RETURN_IF_ERROR(writer.write(src + off, len));
        file.map().drop(abs + off, len);
        *done_in += len;
        if (progress) progress(*done_in, total_in);
      }
    } else {
      const uint64_t in_es = dtype_size(info.dtype), out_es = dtype_size(it.out_dtype);
      const uint64_t chunk_elems = buffer_bytes / std::max(in_es, out_es);
      const uint64_t n = n_in / in_es;
      for (uint64_t e = 0; e < n; e += chunk_elems) {
        uint64_t m = std::min(chunk_elems, n - e);
        VLAC_RETURN_IF_ERROR(convert_elements(info.dtype, it.out_dtype, src + e * in_es, buffer, m));
        VLAC_RETURN_IF_ERROR(writer.write(buffer, m * out_es));
        file.map().drop(abs + e * in_es, m * in_es);
        *done_in += m * in_es;
        if (progress) progress(*done_in, total_in);
      }
      ++stats->n_converted;
    }
    ++stats->n_tensors;
  }
  uint64_t file_bytes = writer.header_bytes() + writer.data_bytes_written();
  VLAC_RETURN_IF_ERROR(writer.finish());
  stats->output_bytes += file_bytes;
  return Status::ok();
}

// Removes the listed files on scope exit unless disarmed (staged shards on failure).
struct Cleanup {
  std::vector<std::string> paths;
  bool armed = true;
  ~Cleanup() {
    if (!armed) return;
    for (const auto& p : paths) unlink(p.c_str());
  }
};

}  // namespace

Result<DType> parse_convert_target(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "bf16" || t == "bfloat16") return DType::BF16;
  if (t == "fp16" || t == "f16" || t == "float16" || t == "half") return DType::F16;
  if (t == "fp32" || t == "f32" || t == "float32" || t == "float") return DType::F32;
  return invalid_argument("--dtype '" + text + "': expected bf16, fp16 or fp32");
}

Status convert_elements(DType from, DType to, const uint8_t* src, uint8_t* dst, uint64_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return Status::ok();
  }
  if (!dtype_is_float(from) || !(to == DType::F32 || to == DType::F16 || to == DType::BF16))
    return invalid_argument(std::string("cannot convert ") + dtype_name(from) + " to " + dtype_name(to));
  switch (from) {
    case DType::F64: from_f64(to, src, dst, n); break;
    case DType::F32: widen_to<DType::F32>(to, src, dst, n); break;
    case DType::F16: widen_to<DType::F16>(to, src, dst, n); break;
    case DType::BF16: widen_to<DType::BF16>(to, src, dst, n); break;
    case DType::F8_E4M3: widen_to<DType::F8_E4M3>(to, src, dst, n); break;
    case DType::F8_E5M2: widen_to<DType::F8_E5M2>(to, src, dst, n); break;
    default: return internal_error("convert_elements: unhandled dtype");
  }
  return Status::ok();
}

Status convert_checkpoint(const ConvertOptions& opt, ConvertStats* stats_out, const ConvertProgressFn& progress) {
  auto t0 = std::chrono::steady_clock::now();
  if (opt.struct_size != sizeof(ConvertOptions)) return invalid_argument("convert: ConvertOptions version mismatch");
  if (!(opt.target == DType::BF16 || opt.target == DType::F16 || opt.target == DType::F32))
    return invalid_argument(std::string("convert: target dtype ") + dtype_name(opt.target) +
                            " is not supported (use BF16, F16 or F32)");
  if (opt.buffer_bytes < 64 || opt.buffer_bytes > (1ull << 30))
    return invalid_argument("convert: buffer size " + std::to_string(opt.buffer_bytes) +
                            " out of range (64 B .. 1 GiB)");
  if (opt.output.empty()) return invalid_argument("convert: empty output path");

  VLAC_ASSIGN_OR_RETURN(TensorSet set, TensorSet::open(opt.input));

  // Select and rename.
  std::vector<Item> items;
  uint64_t total_in = 0;
  for (const auto& e : set.tensors()) {
    const std::string& name = e.info->name;
    if (!opt.prefix.empty() && name.compare(0, opt.prefix.size(), opt.prefix) != 0) continue;
    std::string out_name = name.substr(opt.prefix.size());
    if (out_name.empty())
      return invalid_argument(opt.input + ": tensor '" + name + "' would have an empty name after stripping --prefix");
    DType out_dt = dtype_is_float(e.info->dtype) ? opt.target : e.info->dtype;
    uint64_t out_bytes = e.info->numel() * dtype_size(out_dt);
    items.push_back({&e, std::move(out_name), out_dt, out_bytes});
    total_in += e.info->nbytes();
  }
  if (items.empty()) {
    if (opt.prefix.empty()) return not_found(opt.input + ": no tensors to convert");
    std::string example = set.tensors().empty() ? std::string() : ", e.g. '" + set.tensors().front().info->name + "'";
    return not_found(opt.input + ": no tensor name starts with --prefix '" + opt.prefix + "' (" +
                     std::to_string(set.tensors().size()) + " tensors" + example + ")");
  }

  // Keep the source's own __metadata__ (of the first file; not the index's total_size).
  std::map<std::string, std::string> metadata;
  if (!set.files().empty()) metadata = set.files().front()->metadata();

  // Plan the output files.
  const std::string out_dir = parent_dir(opt.output);
  {
    std::error_code ec;
    if (!fs::is_directory(out_dir, ec))
      return invalid_argument("convert: output folder '" + out_dir + "' does not exist");
  }
  std::vector<Shard> shards;
  if (opt.max_shard_size == 0) {
    shards.push_back({0, items.size(), 0, opt.output});
  } else {
    Shard cur;
    for (size_t i = 0; i < items.size(); ++i) {
      if (cur.end > cur.begin && cur.data_bytes + items[i].out_bytes > opt.max_shard_size) {
        shards.push_back(cur);
        cur = Shard{i, i, 0, {}};
      }
      cur.end = i + 1;
      cur.data_bytes += items[i].out_bytes;
    }
    shards.push_back(cur);
    if (shards.size() == 1) shards[0].final_path = opt.output;  // fits: one plain file, as HF does
  }
  std::string index_path;
  if (shards.size() > 1) {
    std::string base = base_name(opt.output);
    std::string stem = base;
    const std::string ext = ".safetensors";
    if (stem.size() > ext.size() && stem.compare(stem.size() - ext.size(), ext.size(), ext) == 0)
      stem.resize(stem.size() - ext.size());
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", s + 1, n);
      shards[s].final_path = join(out_dir, stem + name);
    }
    index_path = join(out_dir, stem + ".safetensors.index.json");
  }

  // Never write over the input (the index, any shard, or the file itself).
  std::vector<std::string> outputs;
  for (const auto& s : shards) outputs.push_back(s.final_path);
  if (!index_path.empty()) outputs.push_back(index_path);
  for (const auto& out : outputs) {
    if (same_file(out, set.source()))
      return invalid_argument("convert: output '" + out + "' is the input");
    for (const auto& f : set.files())
      if (same_file(out, f->path())) return invalid_argument("convert: output '" + out + "' is an input file");
  }

  auto buffer = std::make_unique_for_overwrite<uint8_t[]>(opt.buffer_bytes);  // untouched pages cost nothing
  ConvertStats stats;
  stats.input_bytes = total_in;
  uint64_t done_in = 0;
  if (progress) progress(0, total_in);

  if (shards.size() == 1) {
    VLAC_RETURN_IF_ERROR(write_shard(shards[0].final_path, items, 0, items.size(), metadata, buffer.get(),
                                     opt.buffer_bytes, total_in, &done_in, &stats, progress));
    stats.output_files.push_back(shards[0].final_path);
  } else {
    // Each shard is complete under a hidden staging name before any final name appears.
    Cleanup staged;
    const std::string tag = ".vlac-part-" + std::to_string(getpid());
    for (auto& s : shards) {
      std::string stage = join(out_dir, "." + base_name(s.final_path) + tag);
      staged.paths.push_back(stage);
      VLAC_RETURN_IF_ERROR(write_shard(stage, items, s.begin, s.end, metadata, buffer.get(), opt.buffer_bytes,
                                       total_in, &done_in, &stats, progress));
    }
    // Index json: weight_map + metadata.total_size (tensor data bytes, as Hugging Face writes it).
    nlohmann::ordered_json index;
    uint64_t total_size = 0;
    for (const auto& s : shards) total_size += s.data_bytes;
    index["metadata"]["total_size"] = total_size;
    auto& wm = index["weight_map"];
    wm = nlohmann::ordered_json::object();
    for (const auto& s : shards)
      for (size_t i = s.begin; i < s.end; ++i) wm[items[i].out_name] = base_name(s.final_path);
    std::string text;
    try {
      text = index.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n";
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(index_path + ": cannot encode the index: " + e.what());
    }
    VLAC_ASSIGN_OR_RETURN(AtomicFile index_file, AtomicFile::create(index_path));
    VLAC_RETURN_IF_ERROR(index_file.write(text.data(), text.size()));
    // All shards are complete: give them their names, then commit the index last.
    std::vector<std::string> renamed;
    for (size_t s = 0; s < shards.size(); ++s) {
      if (std::rename(staged.paths[s].c_str(), shards[s].final_path.c_str()) != 0) {
        Status st = errno_error(shards[s].final_path + ": rename from staging name failed", errno);
        for (const auto& r : renamed) unlink(r.c_str());
        return st;
      }
      renamed.push_back(shards[s].final_path);
    }
    Status st = index_file.commit();
    if (!st.is_ok()) {
      for (const auto& r : renamed) unlink(r.c_str());
      return st;
    }
    staged.armed = false;
    stats.output_bytes += text.size();
    stats.output_files = renamed;
    stats.output_files.push_back(index_path);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats_out != nullptr) *stats_out = std::move(stats);
  return Status::ok();
}

}  // namespace vlac
