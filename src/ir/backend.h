// Backend interfaces (declarations only): what a backend reports to the partitioner, how it
// compiles a subgraph into an engine file, and how the runtime loads and runs that engine.
// Nothing here assumes the CPU: memory is tagged host/device, a run carries an opaque stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "ir/graph.h"

namespace vlac {

// =============================================================================================
// Compile side (links the IR). The partitioner owns assignment; backends only report (ORT).
// =============================================================================================

/// A connected piece of a graph that one engine will run. Borrowed view: `graph` must outlive
/// every call that receives the Subgraph.
struct Subgraph {
  const ir::Graph* graph = nullptr;
  std::vector<ir::NodeId> nodes;     // topological order
  std::vector<ir::ValueId> inputs;   // values produced outside, read inside (engine inputs)
  std::vector<ir::ValueId> outputs;  // values produced inside, read outside or graph outputs
};

/// What compiling and running a subgraph will cost, in bytes; used for the per-engine cap.
struct EngineEstimate {
  uint64_t weights_bytes = 0;  // after conversion/packing, as stored in the engine file
  uint64_t scratch_bytes = 0;  // activations + kernel scratch, planned once at load
  uint64_t compile_peak_bytes = 0;  // extra host memory while compile() runs
};

/// Gives a backend the bytes of one weight while it compiles. The partitioner's last-use table
/// decides when the source may drop the pages (MADV_DONTNEED / FADV_DONTNEED).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// Read-only bytes of `ref` (ref.bytes long), valid until release(ref) or the source dies.
  virtual Result<const uint8_t*> map(const ir::WeightRef& ref) = 0;
  /// The caller no longer needs `ref`'s bytes. Idempotent.
  virtual void release(const ir::WeightRef& ref) = 0;
};

/// Where compile() writes: one engine file per call, under `engine_dir`.
struct CompileOptions {
  uint32_t struct_size = sizeof(CompileOptions);
  std::string engine_dir;          // the file goes to disk at once (never kept in memory)
  DType weight_dtype = DType::F32; // F32 or BF16 (as stored, or converted at compile)
  int n_threads = 0;               // 0: backend default
};

/// An engine written to disk by compile(); the package writer streams it file to file.
struct EngineBlob {
  uint32_t version = 1;
  std::string backend;   // "cpu", "cuda", "null"
  std::string path;      // complete file (written through AtomicFile)
  uint64_t bytes = 0;
  EngineEstimate estimate;
};

class BackendCompiler {
 public:
  virtual ~BackendCompiler() = default;
  virtual std::string_view name() const = 0;
  /// True when this backend can run `node` with its current attributes/dtypes.
  virtual bool supports(const ir::Graph& g, ir::NodeId node) const = 0;
  /// Bytes the subgraph will cost (without reading any weight bytes).
  virtual Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const = 0;
  /// Reads the subgraph's weights from `weights`, converts/packs them, writes one engine file.
  /// Must release every weight it mapped before returning and leave no file on error.
  virtual Result<EngineBlob> compile(const Subgraph& sub, WeightSource& weights,
                                     const CompileOptions& options) = 0;
};

// =============================================================================================
// Runtime side. Uses no IR type: the runtime links this part without ir/ (it can move to
// runtime/ verbatim when that module exists).
// =============================================================================================

enum class MemoryKind : uint8_t {
  Host,     // ordinary CPU memory
  Device,   // accelerator memory (cudaMalloc)
  Unified,  // one pool for both (Jetson); either side may read it
};

/// A borrowed tensor: the caller owns `data` for the duration of run().
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  MemoryKind memory = MemoryKind::Host;
  int32_t rank = 0;
  int64_t shape[6] = {};  // row-major, outermost first
};

/// Inputs and outputs of one run, in the engine's declared order. `stream` is opaque: null for
/// the CPU, a cudaStream_t for CUDA (run() enqueues and returns; the caller synchronizes).
struct RunIo {
  uint32_t struct_size = sizeof(RunIo);
  const TensorView* inputs = nullptr;
  int32_t n_inputs = 0;
  TensorView* outputs = nullptr;
  int32_t n_outputs = 0;
  void* stream = nullptr;
};

/// A loaded engine: weights resident where its backend computes (device memory for CUDA, the
/// mapped package or packed host copies for the CPU), scratch planned and allocated at load.
class Engine {
 public:
  virtual ~Engine() = default;
  /// Runs once. Performs no heap or device allocation (everything was sized at load).
  virtual Status run(const RunIo& io) = 0;
  /// Bytes held: weights resident + scratch, per memory kind.
  virtual uint64_t resident_bytes(MemoryKind kind) const = 0;
};

/// Bytes of a stored engine, e.g. a slice of the mapped package. Borrowed: valid until `release`
/// is called (load() must copy what it keeps, e.g. upload to the GPU, then call release).
struct EngineBlobView {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void (*release)(void* ctx) = nullptr;  // drops the pages; may be null
  void* release_ctx = nullptr;
};

struct LoadOptions {
  uint32_t struct_size = sizeof(LoadOptions);
  int device = 0;          // accelerator ordinal
  void* stream = nullptr;  // stream for uploads (CUDA), null for the CPU
  int n_threads = 0;       // CPU: 0 = default
};

class BackendRuntime {
 public:
  virtual ~BackendRuntime() = default;
  virtual std::string_view name() const = 0;
  /// Builds an Engine from stored bytes; allocates all its memory here, once.
  virtual Result<std::unique_ptr<Engine>> load(const EngineBlobView& blob,
                                               const LoadOptions& options) = 0;
};

}  // namespace vlac
