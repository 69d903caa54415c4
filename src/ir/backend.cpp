// Backend seam helpers (see backend.h): a whole graph as one subgraph, and the file-backed
// weight source the compile drivers give a backend.
#include "ir/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/bytes.h"
#include "core/mapped_file.h"
#include "ir/walk.h"

namespace vlac {

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Host: return "host";
    case MemoryKind::Device: return "device";
    case MemoryKind::Unified: return "unified";
  }
  return "?";
}

Result<Subgraph> whole_graph(const ir::Graph& g) {
  Subgraph s;
  s.graph = &g;
  VLAC_ASSIGN_OR_RETURN(s.nodes, ir::schedule(g));
  s.inputs = g.inputs();
  s.outputs = g.outputs();
  return s;
}

Result<const uint8_t*> FileWeightSource::map(const ir::WeightRef& ref) {
  if (!ref.parts.empty())
    return internal_error("weight '" + ref.name + "' is fused from " + std::to_string(ref.parts.size()) +
                          " tensors: map each of its parts");
  if (ref.file_id >= files_.size()) return internal_error("weight '" + ref.name + "': file id out of range");
  const WeightFileView& f = files_[ref.file_id];
  uint64_t end = 0;
  if (__builtin_add_overflow(ref.offset, ref.bytes, &end) || end > f.size)
    return invalid_format(f.path + ": tensor '" + ref.name + "' lies outside the file");
  return f.data + ref.offset;
}

void FileWeightSource::release_range(const ir::WeightRef& ref, uint64_t offset, uint64_t bytes) {
  if (ref.file_id >= files_.size()) return;
  const WeightFileView& f = files_[ref.file_id];
  if (f.map) f.map->drop(ref.offset + offset, bytes);
  else if (f.release) f.release(ref.offset + offset, bytes);
}

Status Executable::write_input(int i, const void* src, uint64_t bytes) {
  const auto& ins = graph().inputs();
  if (i < 0 || size_t(i) >= ins.size()) return internal_error("write_input: input index out of range");
  if (bytes != graph().info(ins[size_t(i)]).bytes())
    return internal_error("write_input: " + std::to_string(bytes) + " bytes for an input of " +
                          std::to_string(graph().info(ins[size_t(i)]).bytes()));
  bind_input(i, nullptr);
  void* dst = input_data(i);
  if (!dst) return internal_error("write_input: the executable has no own buffer for input " + std::to_string(i));
  if (bytes) std::memcpy(dst, src, bytes);
  return Status::ok();
}

namespace {

class HeapBuffer final : public BackendBuffer {
 public:
  HeapBuffer(void* p, uint64_t bytes) : p_(p), bytes_(bytes) {}
  ~HeapBuffer() override { std::free(p_); }
  void* data() const override { return p_; }
  uint64_t bytes() const override { return bytes_; }
  MemoryKind kind() const override { return MemoryKind::Host; }

 private:
  void* p_;
  uint64_t bytes_;
};

}  // namespace

Result<std::unique_ptr<BackendBuffer>> BackendRuntime::allocate(uint64_t bytes, MemoryKind kind, const std::string& what) {
  if (kind != MemoryKind::Host)
    return unsupported(std::string(name()) + " backend: " + what + ": no " + memory_kind_name(kind) + " memory");
  const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    return Status(StatusCode::ResourceExhausted, std::string(name()) + " backend: " + what + ": out of memory allocating " +
                                                     format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)");
  std::memset(p, 0, rounded);
  return std::unique_ptr<BackendBuffer>(std::make_unique<HeapBuffer>(p, bytes));
}

Status BackendRuntime::use_lane(int lane) {
  if (lane == 0) return Status::ok();
  return unsupported(std::string(name()) + " backend: one lane only (asked for lane " + std::to_string(lane) + ")");
}

Status BackendRuntime::copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
  return Status::ok();
}

}  // namespace vlac
