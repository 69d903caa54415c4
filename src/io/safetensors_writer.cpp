// Streaming safetensors writer (see safetensors_writer.h). Holds no tensor data: bytes pass
// straight to the temporary file; written pages are flushed and dropped behind the writer so
// neither the page cache nor the final fsync grows with the file.
#include "io/safetensors_writer.h"

#include <fcntl.h>

#include <set>

#include <nlohmann/json.hpp>

#include "core/bytes.h"

namespace vlac {

namespace {

// Writeback window: once a window is complete, its writeback starts; the window before it is
// waited for and dropped from the page cache.
constexpr uint64_t kWritebackWindow = 32ull << 20;

Result<std::string> json_string(const std::string& s, const std::string& what) {
  try {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception&) {
    return invalid_argument(what + " '" + s + "' is not valid UTF-8");
  }
}

}  // namespace

Result<std::string> build_safetensors_header(const std::vector<TensorSpec>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool mfirst = true;
    for (const auto& [k, v] : metadata) {
      if (!mfirst) json += ',';
      mfirst = false;
      VLAC_ASSIGN_OR_RETURN(std::string ks, json_string(k, "metadata key"));
      VLAC_ASSIGN_OR_RETURN(std::string vs, json_string(v, "metadata value of '" + k + "'"));
      json += ks;
      json += ':';
      json += vs;
    }
    json += '}';
    first = false;
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) return invalid_argument("safetensors writer: empty tensor name");
    if (t.name == "__metadata__") return invalid_argument("safetensors writer: tensor named '__metadata__'");
    if (!seen.insert(t.name).second) return invalid_argument("safetensors writer: duplicate tensor '" + t.name + "'");
    uint64_t nbytes = dtype_size(t.dtype);
    std::string shape = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] < 0)
        return invalid_argument("safetensors writer: tensor '" + t.name + "' has a negative dimension");
      if (mul_overflow(nbytes, static_cast<uint64_t>(t.shape[i]), &nbytes))
        return invalid_argument("safetensors writer: tensor '" + t.name + "' is too large");
      if (i) shape += ',';
      shape += std::to_string(t.shape[i]);
    }
    shape += ']';
    uint64_t end = 0;
    if (add_overflow(offset, nbytes, &end)) return invalid_argument("safetensors writer: data too large");
    if (!first) json += ',';
    first = false;
    VLAC_ASSIGN_OR_RETURN(std::string ns, json_string(t.name, "tensor name"));
    json += ns;
    json += ":{\"dtype\":\"";
    json += dtype_name(t.dtype);
    json += "\",\"shape\":";
    json += shape;
    json += ",\"data_offsets\":[";
    json += std::to_string(offset);
    json += ',';
    json += std::to_string(end);
    json += "]}";
    offset = end;
  }
  json += '}';
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  while (json.size() % 8 != 0) json += ' ';
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += json;
  return out;
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, std::vector<TensorSpec> tensors,
                                                    std::map<std::string, std::string> metadata) {
  VLAC_ASSIGN_OR_RETURN(std::string header, build_safetensors_header(tensors, metadata));
  uint64_t expected = 0;
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);  // overflow checked by the header
    expected += n;
  }
  VLAC_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  SafetensorsWriter w(std::move(file));
  w.expected_ = expected;
  w.header_bytes_ = header.size();
  VLAC_RETURN_IF_ERROR(w.file_.write(header.data(), header.size()));
  return w;
}

Status SafetensorsWriter::write(const void* data, size_t size) {
  if (size > expected_ - written_)
    return internal_error(file_.final_path() + ": more tensor bytes written than declared (" +
                          std::to_string(expected_) + ")");
  VLAC_RETURN_IF_ERROR(file_.write(data, size));
  uint64_t before = written_;
  written_ += size;
  // Write-behind: bounded dirty pages and page cache, whatever the file size.
  uint64_t base = header_bytes_;
  uint64_t w_before = before / kWritebackWindow, w_now = written_ / kWritebackWindow;
  for (uint64_t w = w_before; w < w_now; ++w) {
    off_t begin = static_cast<off_t>(base + w * kWritebackWindow);
    sync_file_range(file_.fd(), begin, static_cast<off_t>(kWritebackWindow), SYNC_FILE_RANGE_WRITE);
    if (w > 0) {
      off_t prev = begin - static_cast<off_t>(kWritebackWindow);
      sync_file_range(file_.fd(), prev, static_cast<off_t>(kWritebackWindow),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      posix_fadvise(file_.fd(), prev, static_cast<off_t>(kWritebackWindow), POSIX_FADV_DONTNEED);
    }
  }
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (written_ != expected_)
    return internal_error(file_.final_path() + ": " + std::to_string(written_) + " of " +
                          std::to_string(expected_) + " tensor bytes written; not committed");
  // Flush the tail and drop the file's pages (clean now), so the page cache holds none of it.
  if (written_ >= kWritebackWindow) {
    sync_file_range(file_.fd(), 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(file_.fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
  VLAC_RETURN_IF_ERROR(file_.commit());
  return Status::ok();
}

}  // namespace vlac
