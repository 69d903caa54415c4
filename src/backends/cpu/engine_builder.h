// CPU engine builder: writes one engine's weights, converted to the dtypes the CPU kernels run
// in, into an engine file — streamed in bounded chunks from the mapped checkpoint, source pages
// dropped behind, the file's page cache written back and dropped, the heap trimmed after.
// Never holds a whole weight, let alone a whole engine, in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"

namespace vlac::cpu {

/// Where one weight lies in an engine file (offset a multiple of kEngineAlign).
using EngineWeight = BlobWeight;

/// Alignment of every weight inside an engine file (cache line; the package aligns the file).
inline constexpr uint64_t kEngineAlign = 64;

struct EngineFile {
  std::string path;
  uint64_t bytes = 0;
  std::vector<EngineWeight> weights;
};

/// Writes `store` (weights as the model builder referenced them, read through `source`)
/// converted to their run dtypes (F32 or BF16) to `path` (atomically: temporary + rename).
/// Deterministic: same inputs, same bytes (zero padding). `chunk_bytes` bounds the buffer; each
/// chunk's source bytes are released behind the reader.
Result<EngineFile> write_cpu_engine_file(const std::string& path, const std::vector<StoredWeight>& store,
                                         WeightSource& source, uint64_t chunk_bytes = 8ull << 20,
                                         const ir::QuantCalibration* calibration = nullptr);

/// Gives freed heap back to the OS (malloc_trim); called after each engine build.
void release_heap();

}  // namespace vlac::cpu
