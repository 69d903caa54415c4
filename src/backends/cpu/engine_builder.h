// CPU engine builder: writes one engine's weights, converted to the dtypes the CPU kernels run
// in, into an engine file — streamed in bounded chunks from the mapped checkpoint, source pages
// dropped behind, the file's page cache written back and dropped, the heap trimmed after.
// Never holds a whole weight, let alone a whole engine, in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/executor.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ir/graph.h"

namespace vlac::cpu {

/// Where one weight lies in an engine file, in the form the runtime uses it in place.
struct EngineWeight {
  std::string name;
  DType dtype = DType::F32;     // as stored (= as run): F32 or BF16
  std::vector<int64_t> shape;
  uint64_t offset = 0;          // from the start of the engine file; a multiple of kEngineAlign
  uint64_t bytes = 0;
};

/// Alignment of every weight inside an engine file (cache line; the package aligns the file).
inline constexpr uint64_t kEngineAlign = 64;

struct EngineFile {
  std::string path;
  uint64_t bytes = 0;
  std::vector<EngineWeight> weights;
};

/// Writes `weights` (refs into `files`, as the model builder made them) converted to
/// `run_dtypes` (F32 or BF16, one per weight) to `path` (atomically: temporary + rename).
/// Deterministic: same inputs, same bytes (zero padding). `chunk_bytes` bounds the buffer.
Result<EngineFile> write_cpu_engine_file(const std::string& path, const std::vector<ir::WeightRef>& weights,
                                         const std::vector<DType>& run_dtypes, const std::vector<WeightFile>& files,
                                         uint64_t chunk_bytes = 8ull << 20);

/// Gives freed heap back to the OS (malloc_trim); called after each engine build.
void release_heap();

}  // namespace vlac::cpu
