// The backend seam: what a backend's device reports, what it tells the partitioner, how it
// compiles a subgraph into an engine file, and how the runtime binds and runs that engine.
// compile/, runtime/ and policy/ reach a backend only through these interfaces, found by name in
// the registry (backends/registry.h). Nothing here assumes the CPU: memory is tagged
// host/device/unified, a plan says which kind its arena and scratch must live in.
// (Shape learned from ggml's registry -> device -> backend -> buffer and ExecuTorch's
// BackendInterface init/execute; written for vlac's flow: engines on disk, programs as IR.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "ir/graph.h"

namespace vlac {

namespace ir {
class QuantCalibration;
}

class MappedFile;

enum class MemoryKind : uint8_t {
  Host,     // ordinary CPU memory
  Device,   // accelerator memory (cudaMalloc)
  Unified,  // one pool for both (Jetson); either side may read it
};
const char* memory_kind_name(MemoryKind kind);

/// What a backend's device can do (reported, never guessed by callers). Fields that do not apply
/// stay at their zero value.
struct DeviceInfo {
  std::string backend;              // registry name: "cpu", "cuda", ...
  std::string description;          // one line for reports, e.g. "cpu avx512_bf16"
  MemoryKind memory = MemoryKind::Host;  // where its engines' arenas live
  std::string error;                // non-empty: it cannot run as configured (e.g. a bad VLAC_MAX_CPU_ISA)
  std::string detail;               // the path it takes, one line (ISA, caps, libraries)
  std::string f32_path, bf16_path;  // how fp32 / bf16 weights are multiplied, e.g. "oneDNN bf16 matmul"
  std::vector<std::pair<std::string, std::string>> report;  // facts for run reports: name, JSON value
  // CPU
  std::string isa;                  // the ISA the kernels run on, e.g. "avx2", "neon"
  bool bf16_matmul = false;         // native bf16 x bf16 -> f32 matmul on that ISA
  bool int8_matmul = false;         // native u8 x s8 -> s32 matmul
  // GPU
  int compute_major = 0, compute_minor = 0;  // compute capability
  uint64_t total_memory = 0, free_memory = 0;
  std::string memory_source;        // how total/free were read (e.g. "nvml ..."); empty: not read
};

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
/// The whole of `g` as one subgraph: its schedule, inputs and outputs.
Result<Subgraph> whole_graph(const ir::Graph& g);

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
  /// Errors name the file and the tensor (e.g. a tensor outside its file).
  virtual Result<const uint8_t*> map(const ir::WeightRef& ref) = 0;
  /// The caller has read bytes [offset, offset + bytes) of `ref` for the last time: a large
  /// weight streamed in chunks gives its pages back behind the reader.
  virtual void release_range(const ir::WeightRef& ref, uint64_t offset, uint64_t bytes) = 0;
  /// The caller no longer needs `ref`'s bytes. Idempotent.
  virtual void release(const ir::WeightRef& ref) = 0;
};

/// Bytes of one weight file (a mapped safetensors shard, a package segment); borrowed, must
/// outlive what is built over it. WeightRef::file_id indexes a list of these; offsets are
/// absolute in the file.
struct WeightFileView {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  std::string path;                 // for error messages
  const MappedFile* map = nullptr;  // optional: pages read for the last time are dropped from it
  /// Optional, where there is no `map` (a package's segment): gives back the pages of
  /// [offset, offset + bytes) of this view, read for the last time.
  std::function<void(uint64_t offset, uint64_t bytes)> release = nullptr;
  /// Optional: an open file holding the view's bytes at `file_offset`, for reads that map nothing
  /// (pread: a gathered embedding row costs no resident pages; see CudaWeights).
  int fd = -1;
  uint64_t file_offset = 0;
};

/// A WeightSource over mapped files: map() checks the bounds, release drops the pages (when the
/// file has a map).
class FileWeightSource : public WeightSource {
 public:
  explicit FileWeightSource(std::vector<WeightFileView> files) : files_(std::move(files)) {}
  Result<const uint8_t*> map(const ir::WeightRef& ref) override;
  void release_range(const ir::WeightRef& ref, uint64_t offset, uint64_t bytes) override;
  void release(const ir::WeightRef&) override {}

 private:
  std::vector<WeightFileView> files_;
};

/// One weight an engine stores: the reference (as the builder made it) and the dtype it runs in.
struct StoredWeight {
  ir::WeightRef ref;
  DType run_dtype = DType::F32;
};

/// Where compile() writes: one engine file per call, `engine_dir`/`engine_name`.engine.
struct CompileOptions {
  uint32_t struct_size = sizeof(CompileOptions);
  std::string engine_dir;          // the file goes to disk at once (never kept in memory)
  std::string engine_name;
  int n_threads = 0;               // 0: backend default
  /// Activation statistics for the 8-bit weights (`--calibrate`): their rows are rounded by GPTQ
  /// (ir/quant_calib.h). Borrowed; nullptr: round to nearest.
  const ir::QuantCalibration* calibration = nullptr;
};

/// Where one stored weight lies in an engine file, in the form the runtime uses it in place.
struct BlobWeight {
  std::string name;
  DType dtype = DType::F32;     // as stored (= as run)
  std::vector<int64_t> shape;
  uint64_t offset = 0;          // from the start of the engine file
  uint64_t bytes = 0;
};

/// An engine written to disk by compile(); the package writer streams it file to file.
struct EngineBlob {
  uint32_t version = 1;
  std::string backend;   // registry name
  std::string path;      // complete file (written through AtomicFile)
  uint64_t bytes = 0;
  std::vector<BlobWeight> weights;  // one per StoredWeight, in order
  EngineEstimate estimate;
  /// Optional: a JSON object (text) the engine builder stores in the manifest as the engine's
  /// "backend_info" (layouts the kernels read, choices left to load time); "" for none.
  std::string backend_info;
};

/// A stage graph rewritten by BackendCompiler::lower: `value_map[v]` is the new id of value v of
/// the graph given (ir::kNone where the rewrite removed it; every graph output is kept).
struct LoweredGraph {
  ir::Graph graph;
  std::vector<ir::ValueId> value_map;
};

class BackendCompiler {
 public:
  virtual ~BackendCompiler() = default;
  virtual std::string_view name() const = 0;
  /// Rewrites a stage graph into the form this backend's engines store and run, before it is
  /// partitioned (backend-neutral passes such as ir/fuse's fused projections; the result must
  /// compute the same values). nullopt: the graph as given (the default).
  virtual Result<std::optional<LoweredGraph>> lower(const ir::Graph& g) const {
    (void)g;
    return std::optional<LoweredGraph>();
  }
  /// True when this backend runs several same-shape inputs (pi0.5's camera images) faster as one
  /// batched graph than one at a time (a GPU filling its multiprocessors). The default, one
  /// image per run, also keeps a package's actions bit for bit the folder's (which runs one
  /// camera at a time) on every CPU path: oneDNN's fp32 GEMMs sum in another order at other M.
  virtual bool prefers_batched_images() const { return false; }
  /// True when this backend can run `node` with its current attributes/dtypes.
  virtual bool supports(const ir::Graph& g, ir::NodeId node) const = 0;
  /// Bytes the subgraph will cost (without reading any weight bytes).
  virtual Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const = 0;
  /// Writes one engine file for `sub` holding `store` (the weights this engine owns; others it
  /// reads are stored by the engine that owns them), read through `weights`, converted to their
  /// run dtypes. Releases every weight it mapped before returning and leaves no file on error.
  virtual Result<EngineBlob> compile(const Subgraph& sub, const std::vector<StoredWeight>& store,
                                     WeightSource& weights, const CompileOptions& options) = 0;
  /// Called after each engine build: give transient memory back (e.g. malloc_trim).
  virtual void release_memory() {}
};

// =============================================================================================
// Runtime side. An engine's program is a serialized ir::Graph (ir/serialize); the runtime links
// ir/ but never the model builder or the partitioner.
// =============================================================================================

/// The weights one or more programs read, bound by name: `refs[i]` lies in `files[refs[i].file_id]`
/// and runs in `run_dtypes[i]`. `gather_only[i]` (optional): ref i is only gathered from (an
/// embedding table), so a backend may keep it mapped and convert rows on use.
struct WeightBinding {
  std::vector<ir::WeightRef> refs;
  std::vector<DType> run_dtypes;
  std::vector<WeightFileView> files;
  std::vector<bool> gather_only;
  /// By ref: read only by memo nodes (exec::memo_only_weights). A backend that copies weights may
  /// leave such a weight in the file and read it at each memo miss instead of holding it.
  std::vector<bool> on_demand;
};

/// Weights in the form a backend's kernels read (in place from the files, or converted copies).
/// Shared by every executable planned over them; must outlive those.
class BoundWeights {
 public:
  virtual ~BoundWeights() = default;
  virtual uint64_t owned_bytes() const = 0;   // held in converted/uploaded buffers
  virtual uint64_t mapped_bytes() const = 0;  // used in place from the files
};

/// How a program is planned. Backend-neutral meaning; a backend ignores what it cannot use.
struct ExecOptions {
  int threads = 2;
  /// The caller provides the arena and scratch (bind_memory, before each run) and binds every
  /// input: engines that run one after another share one arena.
  bool shared_memory = false;
  /// Weights reordered once into the kernels' preferred layout (a copy the executable owns).
  bool pack_weights = false;
  /// Attention with one KV head shared by several query heads runs its matmuls in bf16
  /// (lerobot's bf16 mode computes Gemma's and the expert's attention so).
  bool bf16_mqa_attention = false;
  /// Opt-in speed over parity for the fp32 part of a bf16-mode prefix (SigLIP, which lerobot's
  /// bf16 mode keeps fp32): fp32 GEMMs use TF32 tensor cores and fp32 attentions with dh 72/256
  /// run in the bf16 attention kernel. Off by default: the default bf16 mode matches lerobot's.
  /// A backend without such kernels ignores it (the CPU does).
  bool fast_vision = false;
  /// An fp8 package compiled with e4m3 activations (`vlac compile --dtype fp8 --activations e4m3`,
  /// manifest precision "fp8-w8a8"): every Linear over F8_E4M3 weights first rounds its x per row
  /// to e4m3 (scale max|row| / 448), as Hopper's FP8 GEMM reads it (W8A8). The CPU emulates the
  /// rounding; the CUDA backend runs the FP8 GEMM where cuBLASLt plans it (VLAC_FP8_GEMM=0 turns
  /// that off for A/B). Without it an fp8 package is W8A16 (x in bf16).
  bool fp8_activations = false;
  /// Names the executable in messages (an engine name, "prefix"); backends prefix their errors
  /// with it (a CUDA error or an out-of-memory names the engine, the node and the bytes).
  std::string label;
  /// Inputs taking few distinct values over the executable's life (pi0.5's denoise time): the
  /// nodes computed from them alone run once per value and are reused (exec/memo_plan).
  std::vector<std::string> memo_inputs;
  int memo_slots = 0;
  /// Inputs whose contents stay the same over consecutive runs until the caller says otherwise
  /// (Executable::inputs_changed): pi0.5's prefix K/V cache, read by all denoising steps of a
  /// chunk. A backend may then keep what it derives from them alone (a GPU: their rows of a
  /// key/value concatenation, in bf16) between runs. A backend ignores it where it cannot use it.
  std::vector<std::string> stable_inputs;
  /// Calibration (`vlac compile --calibrate`): called before each Linear with its weight's name
  /// and its input rows x [rows, k] in fp32. A backend that cannot show them refuses the plan
  /// (the CPU shows them; nodes reused from the memo are not run, so not shown again).
  std::function<void(const std::string& weight, const float* x, int64_t rows, int64_t k)> linear_observer;
};

/// What a planned program needs. With ExecOptions::shared_memory the caller provides the arena
/// and scratch, in `kind` memory, 64-byte aligned.
struct MemoryPlan {
  MemoryKind kind = MemoryKind::Host;
  uint64_t arena_bytes = 0;    // activations (exec::plan_arena)
  uint64_t scratch_bytes = 0;  // kernel scratch
  uint64_t input_bytes = 0;    // the executable's own input buffers (0 with shared_memory)
  uint64_t memo_bytes = 0;     // memo slots, allocated at plan
  uint64_t packed_bytes = 0;   // packed weight copies (ExecOptions::pack_weights)
};

/// A program planned for its input shapes: every buffer sized, weights bound. run() performs no
/// heap or device allocation.
class Executable {
 public:
  virtual ~Executable() = default;
  virtual const ir::Graph& graph() const = 0;
  virtual MemoryPlan memory() const = 0;
  /// With ExecOptions::shared_memory: the arena and scratch (MemoryPlan sizes and kind).
  virtual void bind_memory(void* arena, void* scratch) = 0;
  /// Index into graph().inputs() of the Input node named `name`; -1 if none.
  virtual int input_index(std::string_view name) const = 0;
  /// The executable's own buffer for input i (null with shared_memory).
  virtual void* input_data(int i) = 0;
  /// Reads input i from caller memory instead (borrowed until the next bind); nullptr returns
  /// to the own buffer.
  virtual void bind_input(int i, const void* external) = 0;
  /// Data of a value after run(); graph outputs stay valid until the next run().
  virtual const void* data(ir::ValueId v) const = 0;
  virtual Status run() = 0;
  /// Runs whose memo inputs repeated a value seen before (ExecOptions::memo_inputs).
  virtual uint64_t memo_hits() const = 0;
  virtual size_t memo_nodes() const = 0;
  /// Where input_data(), data() and what bind_input() takes live (MemoryPlan::kind).
  virtual MemoryKind memory_kind() const { return memory().kind; }
  /// Copies `bytes` (= the input's size) from host memory `src` into input i's own buffer, ordered
  /// before the next run(); the input reads its own buffer again (as bind_input(i, nullptr)). On a
  /// GPU an own buffer may be allocated here on first use (never in run()), and `src` must stay
  /// valid until the next synchronize() of the runtime (a backend Host buffer inside a recorded
  /// sequence: RunSequence). Host backends: memcpy.
  virtual Status write_input(int i, const void* src, uint64_t bytes);
  /// The contents of ExecOptions::stable_inputs changed (a new prefix): the next run reads them
  /// again. Binding or writing one of them says so too. Backends that keep nothing: a no-op.
  virtual void inputs_changed() {}
  /// The memo's key for the next runs, given by the caller instead of read from the memo inputs
  /// (which a GPU engine may read from device memory, where the host cannot compare them: pi0.5's
  /// later step engines get `cond` from the first one). The caller vouches that every memo input
  /// is a function of these bytes (pi0.5: t). Empty: keys from the inputs again. Backends that
  /// read keys from host memory anyway may ignore it.
  virtual void set_memo_key(const void* /*key*/, uint64_t /*bytes*/) {}
  /// The next runs wait for mark `mark` of the runtime (BackendRuntime::mark) before their first
  /// node that reads input i, not before the whole run: an engine on one lane starts while the
  /// producer of a later input still runs on another. -1: no wait. One-lane backends: a no-op.
  virtual void wait_input(int /*i*/, int /*mark*/) {}
};

/// Memory a backend allocates for its callers: arenas shared by engines, values crossing engines,
/// and Host staging buffers (page-locked on a GPU, so copies from them are asynchronous and can be
/// recorded in a RunSequence). 64-byte aligned; freed with the object.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual void* data() const = 0;
  virtual uint64_t bytes() const = 0;
  virtual MemoryKind kind() const = 0;
};

/// Runs recorded once and replayed: a GPU backend captures the runs and copies `body` enqueues
/// (CUDA graphs) and replays them; the default just calls `body` each time (the CPU). Per key
/// (e.g. a prefix shape): the first call runs `body` directly (it plans kernels, fills memos),
/// the second records it, later calls replay the recording. So `body` must do the same work on
/// every call, read host memory only from this backend's Host buffers (whose contents at replay
/// are what counts) and never synchronize; host-side decisions in it (memo hits) are frozen at
/// recording. Replanning an executable the body uses needs clear().
class RunSequence {
 public:
  virtual ~RunSequence() = default;
  virtual Status run(uint64_t /*key*/, const std::function<Status()>& body) { return body(); }
  virtual void clear() {}
  /// Calls that replayed a recording.
  virtual uint64_t replays() const { return 0; }
};

class BackendRuntime {
 public:
  virtual ~BackendRuntime() = default;
  virtual std::string_view name() const = 0;
  /// Binds the weights by name (in place where the layout allows; conversions copied).
  virtual Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding& binding) = 0;
  /// Plans `program` (already specialized to its input shapes: ir::respecialize) over `weights`
  /// (from this backend's bind_weights). Errors: an op or dtype the backend cannot run, a weight
  /// absent from `weights` or of another shape.
  virtual Result<std::unique_ptr<Executable>> plan(ir::Graph program, const BoundWeights& weights,
                                                   const ExecOptions& options) = 0;
  /// The memory kind of this backend's executables (arenas, inputs, values).
  virtual MemoryKind memory_kind() const { return MemoryKind::Host; }
  /// `bytes` of `kind` memory (Host: page-locked on a GPU backend); `what` names it in errors
  /// (an out-of-memory error gives the bytes asked for). Default: Host only, from the heap.
  virtual Result<std::unique_ptr<BackendBuffer>> allocate(uint64_t bytes, MemoryKind kind, const std::string& what);
  /// Copies `bytes` between any memory this backend's executables or buffers use and host memory,
  /// ordered with its runs (a GPU: asynchronous on its stream, except to or from pageable host
  /// memory). A host destination holds the bytes after synchronize(). Default: memcpy.
  virtual Status copy(void* dst, const void* src, uint64_t bytes);
  /// Waits until every run and copy enqueued so far is done; reports an asynchronous failure.
  virtual Status synchronize() { return Status::ok(); }
  /// A recorder of run sequences on this backend (see RunSequence); default: runs directly.
  virtual std::unique_ptr<RunSequence> make_sequence() { return std::make_unique<RunSequence>(); }
  /// The backend's own memory by use, for reports: name -> bytes (-1: not measurable here), e.g. a
  /// GPU's context, workspace and live allocations by use. Cheap (no device work); empty by default
  /// and before the backend ran anything.
  virtual std::vector<std::pair<std::string, int64_t>> memory_breakdown() const { return {}; }
  /// Lanes: queues that run beside each other (a GPU: streams), ordered against each other only
  /// by marks. Runs, copies and marks go to the current lane (0 unless use_lane said otherwise).
  /// Default: one lane, where everything runs in order, marks are -1 and waits do nothing.
  virtual int lanes() const { return 1; }
  virtual Status use_lane(int lane);
  /// A point after everything enqueued so far on the current lane: its id (>= 0), or -1 on a
  /// one-lane backend. Ids count from the last clear_marks().
  virtual Result<int> mark() { return -1; }
  /// Work enqueued next on the current lane waits until mark `id` is reached (none when id < 0).
  virtual Status wait_mark(int /*id*/) { return Status::ok(); }
  /// Mark ids start again from 0 (once per recorded sequence: the marks it records are reused).
  virtual void clear_marks() {}
};

/// One backend: its device, and its compile and runtime halves (the compiler may be null for a
/// backend that only runs packages).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual DeviceInfo device() const = 0;
  virtual BackendCompiler* compiler() = 0;
  virtual BackendRuntime& runtime() = 0;
};

}  // namespace vlac
