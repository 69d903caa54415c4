// Backend seam helpers (see backend.h): a whole graph as one subgraph, and the file-backed
// weight source the compile drivers give a backend.
#include "ir/backend.h"

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
}

}  // namespace vlac
